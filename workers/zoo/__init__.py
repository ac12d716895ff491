"""Model zoo: a manifest of named models, fetched into a checksummed cache."""

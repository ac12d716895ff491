"""ampci's identity on GitHub, below every floor that needs it: the bounded HTTP transport every GitHub
call goes through, the App's JWTs and installation tokens, the short-lived token a worker clones a
private pass repository with, and the exchange of a manifest code for a new App's credentials.  Imports nothing of the service but its settings and errors."""

"""The ``ampci`` command-line interface: a noun-verb tree of thin modules over library functions."""

"""The command line: each command in its own module, rendering what the library returns."""

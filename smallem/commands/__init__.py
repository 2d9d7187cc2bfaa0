"""The library's commands: each one's options and body, one module a command (the book's
chapters bring their own, through :func:`smallem.book.commands`). The library's modules hold
no command-line code; :mod:`smallem.cli` only dispatches."""

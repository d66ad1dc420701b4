"""The commands of ``nmt``, one module each; :mod:`nmt.cli.main` assembles them and reports their
errors."""

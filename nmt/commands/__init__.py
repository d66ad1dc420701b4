"""The commands of ``nmt``, one module each; :mod:`nmt.cli` assembles them and reports their
errors."""

"""``python -m nmt``: the command line (:mod:`nmt.cli.main`)."""

from nmt.cli.main import main

if __name__ == "__main__":  # guarded: worker processes started by spawn import this module
    main()

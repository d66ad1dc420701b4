from .cli import main

if __name__ == "__main__":  # guarded: worker processes started by spawn import this module
    main()

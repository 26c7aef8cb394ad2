"""``python -m nbtrainer``: the command line (see ``nbtrainer._shell._cli``)."""

from nbtrainer._shell._cli import main

if __name__ == "__main__":
    raise SystemExit(main())

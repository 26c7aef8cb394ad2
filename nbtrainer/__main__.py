"""``python -m nbtrainer``: the command line (see ``nbtrainer._cli``)."""

from nbtrainer._cli import main

if __name__ == "__main__":
    raise SystemExit(main())

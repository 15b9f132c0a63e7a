"""``python -m fastdata`` is the same as the ``fastdata`` command."""

from fastdata.cli import main

if __name__ == "__main__":
    main()

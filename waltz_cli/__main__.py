"""`python -m waltz_cli`: the same as the `waltz` command."""

from waltz_cli.main import main

main()

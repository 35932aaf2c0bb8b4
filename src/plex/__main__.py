"""`python -m plex` runs the CLI."""

from plex.cli import main

main()

"""Project tooling (model fetching, ...) the Makefile, tests/ and bench/ call; see each module's docstring."""

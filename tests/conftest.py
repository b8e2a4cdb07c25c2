"""Shared test setup. The project's code is imported as the collection topolaunch.sglang
(`ansible_collections.topolaunch.sglang.plugins...`): `make setup` puts collections/ on the venv's path."""

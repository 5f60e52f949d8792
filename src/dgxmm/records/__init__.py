"""The deployment record, its states, and the changes its listeners hear: what every layer reads."""

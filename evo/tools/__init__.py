"""Floor 3: the tools that study, export and report what runs measured, and the CLI over everything."""

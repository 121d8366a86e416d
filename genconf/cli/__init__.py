"""The command line: the parser and its flags (parser), the subcommands (commands), what they print (text) and
the entry point (main)."""

"""MCP servers as functions: the user's own tools, in every mode and in cron code."""

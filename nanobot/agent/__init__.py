"""The agent: prompt building, the turn loop, execution modes and chat commands."""

"""Chat channel adapters. Each registers under the ``nanobot.channels`` entry-point group."""

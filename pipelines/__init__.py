"""Jobs, schedules and the Definitions of the relgate code location."""

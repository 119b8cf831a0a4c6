"""relgate-agent: host agent, coordinator and network lab for checkpoint distribution."""

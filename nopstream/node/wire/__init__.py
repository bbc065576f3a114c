"""A job's control plane on the wire: its messages, the coordinator's routes and their clients, a task's
server, and the secret that guards them all."""

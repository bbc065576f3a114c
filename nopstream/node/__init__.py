"""One process of a job, as both the local runner and the Kubernetes pods run it: a task or a coordinator."""

"""The nopstream Kubernetes operator (kopf): StreamJobs -> plans, pods, runs and status."""

from nopstream_operator import handlers as handlers

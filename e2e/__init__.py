"""Test infrastructure: real servers (etcd, MinIO, a Kubernetes control plane) and a node agent."""

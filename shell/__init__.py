"""tandem: batched inference on Celery and Redis, with two-level scheduling.

This folder is the `tandem` package itself and holds the shell: the `tandem` command
(cli), the local stack it starts (stack, server) and the status view. The layers below it
are subpackages kept in their own folders: tandem.broker (the protocol), and the roles
tandem.producers, tandem.workers and tandem.coordinator. Tools (benchmarks, soak, demo)
are tandem.tools, which nothing here imports. See docs/architecture.md.
"""

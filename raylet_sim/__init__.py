"""The simulated scheduler: a worker pool that counts runtime-env ids, with the agent as sidecar.

It imports nothing from ``agent``: only the generated protocol stubs in ``rtenv``.
"""

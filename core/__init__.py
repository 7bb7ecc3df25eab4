"""The torch-free core that the engine and the simulator both stand on: model configs, GPU specs
and the roofline, the request and pass records, the KV block pool, the scheduling policies,
the routers, the metrics, and where runs live on disk. Imports neither torch nor simpy."""

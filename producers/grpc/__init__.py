"""The gateway's gRPC side: the Open Inference Protocol's GRPCInferenceService."""

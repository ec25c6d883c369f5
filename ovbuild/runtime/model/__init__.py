"""The compiled model: executors, static copies, input binding, padding, weight narrowing, devices and the machine."""

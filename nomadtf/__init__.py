"""nomadtf: deploy and supervise distributed TensorFlow training on HashiCorp Nomad."""

__version__ = "0.1.0"

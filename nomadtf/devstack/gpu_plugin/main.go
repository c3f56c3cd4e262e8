// SPDX-License-Identifier: MPL-2.0

// Command nomadtf-fake-gpu is a Nomad device plugin that advertises NVIDIA GPUs that do
// not exist, so GPU jobs can be scheduled and tested on machines without GPUs.
// Nomad starts it from the client's plugin_dir; run by hand it only says so and exits.
package main

import (
	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/device"
)

func main() {
	logger := log.New(&log.LoggerOptions{Level: log.Trace, JSONFormat: true})
	device.Serve(NewFakeGPU(logger), logger)
}

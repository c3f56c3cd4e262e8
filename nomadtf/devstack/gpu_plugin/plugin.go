// SPDX-License-Identifier: MPL-2.0

package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	"github.com/hashicorp/nomad/plugins/shared/structs"
)

const (
	pluginName    = "nomadtf-fake-gpu"
	pluginVersion = "0.1.0"

	// What the NVIDIA plugin reports, so jobs written for real GPUs
	// (`device "nvidia/gpu" { ... }`) schedule here unchanged.
	vendor     = "nvidia"
	deviceType = device.DeviceTypeGPU

	visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

	defaultModel         = "Tesla-V100-SXM2-16GB"
	defaultMemoryMiB     = 16160
	defaultDriverVersion = "535.104.05"

	// Attribute names and units as the NVIDIA plugin reports them.
	attrMemory          = "memory"
	attrPower           = "power"
	attrBAR1            = "bar1"
	attrDriverVersion   = "driver_version"
	attrCoresClock      = "cores_clock"
	attrMemoryClock     = "memory_clock"
	attrPCIBandwidth    = "pci_bandwidth"
	attrDisplayState    = "display_state"
	attrPersistenceMode = "persistence_mode"

	// Fixed values of a data-centre card: no display, persistence on, PCIe gen3 x16.
	fakePowerW         = 300
	fakeCoresClockMHz  = 1530
	fakeMemoryClockMHz = 877
	fakePCIBandwidth   = 16384 // MB/s
	fakeDisplayState   = "Disabled"
	fakePersistence    = "Enabled"
)

var (
	pluginInfo = &base.PluginInfoResponse{
		Type:              base.PluginTypeDevice,
		PluginApiVersions: []string{device.ApiVersion010},
		PluginVersion:     pluginVersion,
		Name:              pluginName,
	}

	// configSpec is the `config { ... }` of `plugin "nomadtf-fake-gpu"` in a client's config.
	configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
		"enabled": hclspec.NewDefault(
			hclspec.NewAttr("enabled", "bool", false),
			hclspec.NewLiteral("true"),
		),
		"count": hclspec.NewDefault(
			hclspec.NewAttr("count", "number", false),
			hclspec.NewLiteral("1"),
		),
		"model": hclspec.NewDefault(
			hclspec.NewAttr("model", "string", false),
			hclspec.NewLiteral(fmt.Sprintf("%q", defaultModel)),
		),
		"memory_mib": hclspec.NewDefault(
			hclspec.NewAttr("memory_mib", "number", false),
			hclspec.NewLiteral(fmt.Sprint(defaultMemoryMiB)),
		),
		"driver_version": hclspec.NewDefault(
			hclspec.NewAttr("driver_version", "string", false),
			hclspec.NewLiteral(fmt.Sprintf("%q", defaultDriverVersion)),
		),
		// The device IDs derive from the seed; an empty seed means the host name.
		"seed": hclspec.NewDefault(
			hclspec.NewAttr("seed", "string", false),
			hclspec.NewLiteral(`""`),
		),
		// When given, exactly these instance IDs (a real machine's GPU UUIDs), one group of
		// `model`: they replace `count` and the IDs derived from the seed.
		"ids": hclspec.NewAttr("ids", "list(string)", false),
		// When given, one device group per entry replaces count/model/memory_mib.
		"models": hclspec.NewBlockList("models", hclspec.NewObject(map[string]*hclspec.Spec{
			"model": hclspec.NewAttr("model", "string", true),
			"count": hclspec.NewDefault(
				hclspec.NewAttr("count", "number", false),
				hclspec.NewLiteral("1"),
			),
			// 0 means the top-level memory_mib.
			"memory_mib": hclspec.NewDefault(
				hclspec.NewAttr("memory_mib", "number", false),
				hclspec.NewLiteral("0"),
			),
		})),
		// Accepted for parity with the NVIDIA plugin; the fake devices never change.
		"fingerprint_period": hclspec.NewDefault(
			hclspec.NewAttr("fingerprint_period", "string", false),
			hclspec.NewLiteral(`"1m"`),
		),
	})
)

// GroupConfig is one entry of `models`.
type GroupConfig struct {
	Model     string `codec:"model"`
	Count     int    `codec:"count"`
	MemoryMiB int    `codec:"memory_mib"`
}

// Config is the decoded plugin configuration.
type Config struct {
	Enabled           bool          `codec:"enabled"`
	Count             int           `codec:"count"`
	Model             string        `codec:"model"`
	MemoryMiB         int           `codec:"memory_mib"`
	DriverVersion     string        `codec:"driver_version"`
	Seed              string        `codec:"seed"`
	IDs               []string      `codec:"ids"`
	Models            []GroupConfig `codec:"models"`
	FingerprintPeriod string        `codec:"fingerprint_period"`
}

// FakeGPU is a device plugin that advertises GPUs that do not exist.
type FakeGPU struct {
	logger hclog.Logger

	mu      sync.RWMutex
	enabled bool
	groups  []*device.DeviceGroup
	ids     map[string]struct{}
}

// NewFakeGPU returns an unconfigured plugin; Nomad calls SetConfig before anything else.
func NewFakeGPU(logger hclog.Logger) *FakeGPU {
	return &FakeGPU{logger: logger.Named(pluginName), ids: map[string]struct{}{}}
}

func (d *FakeGPU) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }

func (d *FakeGPU) ConfigSchema() (*hclspec.Spec, error) { return configSpec, nil }

func (d *FakeGPU) SetConfig(cfg *base.Config) error {
	config := Config{
		Enabled:           true,
		Count:             1,
		Model:             defaultModel,
		MemoryMiB:         defaultMemoryMiB,
		DriverVersion:     defaultDriverVersion,
		FingerprintPeriod: "1m",
	}
	if cfg != nil && len(cfg.PluginConfig) != 0 {
		if err := base.MsgPackDecode(cfg.PluginConfig, &config); err != nil {
			return err
		}
	}
	if _, err := time.ParseDuration(config.FingerprintPeriod); err != nil {
		return fmt.Errorf("failed to parse fingerprint period %q: %v", config.FingerprintPeriod, err)
	}
	seed := config.Seed
	if seed == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("seed is empty and the host name is unknown: %v", err)
		}
		seed = host
	}
	groups, err := buildGroups(config, seed)
	if err != nil {
		return err
	}
	ids := map[string]struct{}{}
	for _, g := range groups {
		for _, dev := range g.Devices {
			ids[dev.ID] = struct{}{}
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	d.enabled = config.Enabled
	d.groups = groups
	d.ids = ids
	d.logger.Info("configured fake GPUs", "groups", len(groups), "devices", len(ids), "seed", seed)
	return nil
}

// buildGroups turns the configuration into device groups, one per model name.
func buildGroups(config Config, seed string) ([]*device.DeviceGroup, error) {
	specs := config.Models
	if len(config.IDs) != 0 {
		if len(specs) != 0 {
			return nil, fmt.Errorf("ids and models cannot both be given")
		}
		seen := map[string]bool{}
		for i, id := range config.IDs {
			if id == "" || seen[id] {
				return nil, fmt.Errorf("ids[%d]: %q is empty or listed twice", i, id)
			}
			seen[id] = true
		}
		specs = []GroupConfig{{Model: config.Model, Count: len(config.IDs), MemoryMiB: config.MemoryMiB}}
	} else if len(specs) == 0 {
		specs = []GroupConfig{{Model: config.Model, Count: config.Count, MemoryMiB: config.MemoryMiB}}
	}
	byModel := map[string]*device.DeviceGroup{}
	var order []string
	index := 0
	for i, spec := range specs {
		if spec.Model == "" {
			return nil, fmt.Errorf("models[%d]: model must not be empty", i)
		}
		if spec.Count < 0 {
			return nil, fmt.Errorf("model %q: count must be >= 0, not %d", spec.Model, spec.Count)
		}
		memory := spec.MemoryMiB
		if memory == 0 {
			memory = config.MemoryMiB
		}
		if memory <= 0 {
			return nil, fmt.Errorf("model %q: memory_mib must be > 0, not %d", spec.Model, memory)
		}
		group, seen := byModel[spec.Model]
		if !seen {
			group = &device.DeviceGroup{
				Vendor:     vendor,
				Type:       deviceType,
				Name:       spec.Model,
				Attributes: groupAttributes(int64(memory), config.DriverVersion),
			}
			byModel[spec.Model] = group
			order = append(order, spec.Model)
		} else if *group.Attributes[attrMemory].Int != int64(memory) {
			return nil, fmt.Errorf("model %q is listed twice with different memory_mib", spec.Model)
		}
		for n := 0; n < spec.Count; n++ {
			id := deviceID(seed, spec.Model, len(group.Devices))
			if len(config.IDs) != 0 {
				id = config.IDs[n]
			}
			group.Devices = append(group.Devices, &device.Device{
				ID:         id,
				Healthy:    true,
				HwLocality: &device.DeviceLocality{PciBusID: fmt.Sprintf("00000000:%02X:00.0", 0x10+index)},
			})
			index++
		}
	}
	groups := make([]*device.DeviceGroup, 0, len(order))
	for _, name := range order {
		if g := byModel[name]; len(g.Devices) > 0 {
			// The NVIDIA plugin lists a group's devices sorted by UUID.
			sort.Slice(g.Devices, func(a, b int) bool { return g.Devices[a].ID < g.Devices[b].ID })
			groups = append(groups, g)
		}
	}
	return groups, nil
}

// deviceID is a UUID-shaped ID that depends only on (seed, model, n), so a restarted
// plugin or client reports the same devices and existing allocations keep theirs.
func deviceID(seed, model string, n int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("nomadtf-fake-gpu\x00%s\x00%s\x00%d", seed, model, n)))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x40 // version 4 layout
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func intAttr(v int64, unit string) *structs.Attribute {
	return &structs.Attribute{Int: &v, Unit: unit}
}

func stringAttr(v string) *structs.Attribute {
	return &structs.Attribute{String: &v}
}

func groupAttributes(memoryMiB int64, driverVersion string) map[string]*structs.Attribute {
	return map[string]*structs.Attribute{
		attrMemory:          intAttr(memoryMiB, structs.UnitMiB),
		attrPower:           intAttr(fakePowerW, structs.UnitW),
		attrBAR1:            intAttr(memoryMiB, structs.UnitMiB),
		attrCoresClock:      intAttr(fakeCoresClockMHz, structs.UnitMHz),
		attrMemoryClock:     intAttr(fakeMemoryClockMHz, structs.UnitMHz),
		attrPCIBandwidth:    intAttr(fakePCIBandwidth, structs.UnitMBPerS),
		attrDisplayState:    stringAttr(fakeDisplayState),
		attrPersistenceMode: stringAttr(fakePersistence),
		attrDriverVersion:   stringAttr(driverVersion),
	}
}

// Fingerprint sends the devices once; like the NVIDIA plugin it sends again only on a
// change, and fake devices never change, so the stream stays open and quiet.
func (d *FakeGPU) Fingerprint(ctx context.Context) (<-chan *device.FingerprintResponse, error) {
	d.mu.RLock()
	enabled, groups := d.enabled, d.groups
	d.mu.RUnlock()
	if !enabled {
		return nil, device.ErrPluginDisabled
	}
	out := make(chan *device.FingerprintResponse)
	go func() {
		defer close(out)
		select {
		case out <- device.NewFingerprint(groups...):
		case <-ctx.Done():
			return
		}
		<-ctx.Done()
	}()
	return out, nil
}

// Reserve tells Nomad which environment to give a task that was granted deviceIDs.
func (d *FakeGPU) Reserve(deviceIDs []string) (*device.ContainerReservation, error) {
	if len(deviceIDs) == 0 {
		return &device.ContainerReservation{}, nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if !d.enabled {
		return nil, device.ErrPluginDisabled
	}
	var unknown []string
	for _, id := range deviceIDs {
		if _, ok := d.ids[id]; !ok {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) != 0 {
		return nil, fmt.Errorf("unknown device IDs: %s", strings.Join(unknown, ","))
	}
	return &device.ContainerReservation{
		Envs: map[string]string{visibleDevicesEnv: strings.Join(deviceIDs, ",")},
	}, nil
}

// Stats streams idle statistics (nothing runs on a fake GPU) every interval.
func (d *FakeGPU) Stats(ctx context.Context, interval time.Duration) (<-chan *device.StatsResponse, error) {
	d.mu.RLock()
	enabled, groups := d.enabled, d.groups
	d.mu.RUnlock()
	if !enabled {
		return nil, device.ErrPluginDisabled
	}
	if interval <= 0 {
		interval = time.Second
	}
	out := make(chan *device.StatsResponse)
	go func() {
		defer close(out)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
				timer.Reset(interval)
			}
			select {
			case out <- idleStats(groups, time.Now()):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func idleStats(groups []*device.DeviceGroup, now time.Time) *device.StatsResponse {
	resp := &device.StatsResponse{Groups: make([]*device.DeviceGroupStats, 0, len(groups))}
	for _, g := range groups {
		memory := *g.Attributes[attrMemory].Int
		instances := make(map[string]*device.DeviceStats, len(g.Devices))
		for _, dev := range g.Devices {
			memoryState := fraction(0, memory, "MiB", "memory used / total")
			instances[dev.ID] = &device.DeviceStats{
				Summary: memoryState,
				Stats: &structs.StatObject{Attributes: map[string]*structs.StatValue{
					"Power usage":         fraction(0, fakePowerW, "W", "power drawn / power limit"),
					"GPU utilization":     scalar(0, "%", "share of the last period a kernel ran"),
					"Memory utilization":  scalar(0, "%", "share of memory bandwidth used"),
					"Encoder utilization": scalar(0, "%", "share of the last period the encoder ran"),
					"Decoder utilization": scalar(0, "%", "share of the last period the decoder ran"),
					"Temperature":         scalar(0, "C", "temperature"),
					"Memory state":        memoryState,
					"BAR1 buffer state":   fraction(0, memory, "MiB", "BAR1 used / total"),
					"ECC L1 errors":       scalar(0, "#", "L1 cache ECC errors"),
					"ECC L2 errors":       scalar(0, "#", "L2 cache ECC errors"),
					"ECC memory errors":   scalar(0, "#", "device memory ECC errors"),
				}},
				Timestamp: now,
			}
		}
		resp.Groups = append(resp.Groups, &device.DeviceGroupStats{
			Vendor: g.Vendor, Type: g.Type, Name: g.Name, InstanceStats: instances,
		})
	}
	return resp
}

func scalar(v int64, unit, desc string) *structs.StatValue {
	return &structs.StatValue{IntNumeratorVal: &v, Unit: unit, Desc: desc}
}

func fraction(num, den int64, unit, desc string) *structs.StatValue {
	return &structs.StatValue{IntNumeratorVal: &num, IntDenominatorVal: &den, Unit: unit, Desc: desc}
}

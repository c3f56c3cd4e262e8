// Command nomadtf-consul-engine serves the Consul secrets engine of HashiCorp Vault
// v1.14.8 as an external secrets plugin for OpenBao, which no longer ships that engine.
//
// Only these lines are ours: the engine itself is the package
// github.com/hashicorp/vault/builtin/logical/consul, imported (never copied) from the Go
// module proxy. Vault v1.14.8 is the last v1.14 release whose LICENSE is MPL-2.0 (v1.14.9
// and later are BUSL); nomadtf/devstack/consul_engine.py checks every linked module's
// licence before it builds this.
package main

import (
	"os"

	hclog "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/vault/api"
	"github.com/hashicorp/vault/builtin/logical/consul"
	"github.com/hashicorp/vault/sdk/plugin"
)

func main() {
	// The flags OpenBao passes to a plugin (-ca-cert and friends) and, for servers too old
	// for automatic mTLS, the TLS set-up they describe.
	meta := &api.PluginAPIClientMeta{}
	_ = meta.FlagSet().Parse(os.Args[1:])
	err := plugin.ServeMultiplex(&plugin.ServeOpts{
		BackendFactoryFunc: consul.Factory,
		TLSProviderFunc:    api.VaultPluginTLSProvider(meta.GetTLSConfig()),
	})
	if err != nil {
		hclog.New(&hclog.LoggerOptions{}).Error("plugin shutting down", "error", err)
		os.Exit(1)
	}
}

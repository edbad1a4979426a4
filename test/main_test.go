// Package test holds kvnet's integration tests: a real kube-apiserver and
// etcd, kvnet's manager running against them, and the webhooks registered so
// that every create and update below goes through the API server's own
// admission chain.
package test

import (
	"fmt"
	"os"
	"testing"

	"github.com/kvnet/kvnet/test/framework"
)

// env is shared by every test of the package; tests isolate themselves by
// namespace.
var env *framework.Env

// testConfig is the policy the suite runs with. Tests that need another call
// env.SetConfig and must not run in parallel.
const testConfig = `
networkRules:
  - name: storage
    namespaceSelector:
      matchLabels: {kvnet.io/storage-network: "true"}
    networks:
      - {name: storage, nad: storage}
vdpa:
  resourcePrefixes: ["jaguarmicro.com/"]
kubeOVN:
  legacyLiveMigration: true
`

func TestMain(m *testing.M) {
	var err error
	env, err = framework.Start(framework.Options{ConfigYAML: testConfig})
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration environment:", err)
		os.Exit(1)
	}
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

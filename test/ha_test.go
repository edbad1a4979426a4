package test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvnet/kvnet/test/framework"
)

// writeConfig replaces the file at path in one rename, as the kubelet swaps a
// ConfigMap volume's symlink: a watcher never reads half a file.
func writeConfig(t *testing.T, path, yaml string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startReplicas starts n kvnet replicas under one leader election on env's
// API server, all watching the config file at path, and waits for a leader.
func startReplicas(t *testing.T, n int, path, lease string) []*framework.Replica {
	t.Helper()
	var rs []*framework.Replica
	for i := range n {
		r, err := framework.StartReplica(env.Config, framework.ReplicaOptions{
			ConfigPath: path, LeaderElectionID: lease, Name: fmt.Sprintf("replica-%d", i),
		})
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		t.Cleanup(func() {
			if err := r.Stop(); err != nil {
				t.Errorf("replica %d: %v", i, err)
			}
		})
		rs = append(rs, r)
	}
	framework.Eventually(t, "a replica elected leader", 60*time.Second, func() error {
		leaders := 0
		for _, r := range rs {
			if r.Leader() {
				leaders++
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d leaders", leaders)
		}
		return nil
	})
	return rs
}

// ruleNames is what tells the policies of this test apart.
func ruleNames(r *framework.Replica) []string {
	var out []string
	for _, rule := range r.Watcher.Get().NetworkRules {
		out = append(out, rule.Name)
	}
	return out
}

func haPolicy(rule string) string {
	return fmt.Sprintf("networkRules:\n  - name: %s\n    networks:\n      - {name: storage, nad: storage}\n", rule)
}

// TestConfigReloadsOnEveryReplica runs two replicas under leader election:
// every replica admits, so a new policy must reach the follower as well as
// the leader, and a broken file must leave both on the policy they had,
// counted once per replica. (Before config.Watcher said it needs no leader
// election, the follower never started its watcher and kept its start-up
// policy: this test failed at "policy v2 on every replica".)
func TestConfigReloadsOnEveryReplica(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, haPolicy("v1"))
	rs := startReplicas(t, 2, path, "kvnet-ha-config")

	onEvery := func(rule string) func() error {
		return func() error {
			for i, r := range rs {
				if got := ruleNames(r); len(got) != 1 || got[0] != rule {
					return fmt.Errorf("replica %d (leader %v) has rules %v", i, r.Leader(), got)
				}
			}
			return nil
		}
	}
	writeConfig(t, path, haPolicy("v2"))
	framework.Eventually(t, "policy v2 on every replica", 30*time.Second, onEvery("v2"))

	failed := metricValue(t, "kvnet_config_reloads_total", map[string]string{"result": "failure"})
	writeConfig(t, path, "networkRules: [{name: broken, networks: [{name: x}]}]\n")
	framework.Eventually(t, "the broken file counted once per replica", 30*time.Second, func() error {
		if got := metricValue(t, "kvnet_config_reloads_total", map[string]string{"result": "failure"}) - failed; got != float64(len(rs)) {
			return fmt.Errorf("%v failures counted, want %d", got, len(rs))
		}
		return nil
	})
	if err := onEvery("v2")(); err != nil {
		t.Fatalf("a broken file replaced the policy in force: %v", err)
	}

	writeConfig(t, path, haPolicy("v3"))
	framework.Eventually(t, "policy v3 on every replica after the broken file", 30*time.Second, onEvery("v3"))
}

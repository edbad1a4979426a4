package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
)

const examples = "../../../examples"

func run(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errw bytes.Buffer
	err = app.Run(context.Background(), args, strings.NewReader(stdin), &out, &errw)
	return out.String(), errw.String(), err
}

func clusterFlags() []string {
	return []string{
		"--nads", filepath.Join(examples, "nads.yaml"), "--nads", filepath.Join(examples, "namespaces.yaml"),
		"--config", filepath.Join(examples, "config.yaml"), "--kubevirt", filepath.Join(examples, "kubevirt.yaml"),
	}
}

// The offline CLI and the webhook give the same results on examples/: the
// CLI's output is byte for byte the golden file the webhook's own handler
// test (webhook.TestGolden) produces from the same inputs.
func TestMutateExamplesEqualsWebhookGolden(t *testing.T) {
	want, err := os.ReadFile("../../../webhook/testdata/examples-vms.golden.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(t, "", append([]string{"mutate", "-f", filepath.Join(examples, "vms.yaml")}, clusterFlags()...)...)
	if err != nil {
		t.Fatalf("mutate: %v\n%s", err, stderr)
	}
	// Capabilities may print objects the VMs imply (IPAMClaims); the VMs
	// themselves must be exactly the webhook's.
	if got := vmDocs(out); got != string(want) {
		t.Errorf("kvnet mutate differs from the webhook golden:\n--- got\n%s", got)
	}
	if !strings.Contains(stderr, "Warning: ") || strings.Contains(stderr, "Error: ") {
		t.Errorf("stderr = %q: want the vDPA migration warning and no error", stderr)
	}

	// The same from stdin.
	data, err := os.ReadFile(filepath.Join(examples, "vms.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out2, _, err := run(t, string(data), append([]string{"mutate", "-f", "-"}, clusterFlags()...)...)
	if err != nil || out2 != out {
		t.Errorf("mutate -f - differs from -f file (err %v)", err)
	}
}

func TestValidateExamples(t *testing.T) {
	out, _, err := run(t, "", append([]string{"validate", "-f", filepath.Join(examples, "vms.yaml")}, clusterFlags()...)...)
	if err != nil {
		t.Fatalf("validate of valid examples: %v\n%s", err, out)
	}
	if n := strings.Count(out, ": valid\n"); n != 4 {
		t.Errorf("want 4 valid objects:\n%s", out)
	}

	out, _, err = run(t, "", append([]string{"validate", "-f", filepath.Join(examples, "invalid.yaml")}, clusterFlags()...)...)
	if err == nil || app.ExitCode(err) != 1 {
		t.Fatalf("validate of invalid examples: err %v (exit %d), want exit 1", err, app.ExitCode(err))
	}
	for _, want := range []string{
		"bridged-vf",
		"spec.template.spec.domain.devices.interfaces[0]",
		"spec.template.spec.networks[0].multus.networkName: Not found",
		"spec.template.spec.domain.devices.interfaces[1].name",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, ": invalid: ") != 2 {
		t.Errorf("want two invalid objects:\n%s", out)
	}

	// mutate prints no refused object and exits 1.
	mout, merr, err := run(t, "", append([]string{"mutate", "-f", filepath.Join(examples, "invalid.yaml")}, clusterFlags()...)...)
	if app.ExitCode(err) != 1 || strings.TrimSpace(mout) != "" || strings.Count(merr, "Error: ") != 2 {
		t.Errorf("mutate of invalid examples: exit %d, stdout %q, stderr %q", app.ExitCode(err), mout, merr)
	}
}

// kvnet cannot run: a bad config (with its line) or a missing file, exit 2.
func TestCannotRun(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(bad, []byte("networkRules:\n  - name: a\n    networks:\n      - {name: x, nad: br, binding: Not_OK}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := run(t, "", "mutate", "-f", filepath.Join(examples, "vms.yaml"), "--config", bad)
	if err == nil || app.ExitCode(err) != 2 || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), "binding") {
		t.Errorf("bad config: %v (exit %d)", err, app.ExitCode(err))
	}
	_, _, err = run(t, "", "validate", "-f", filepath.Join(dir, "missing.yaml"))
	if err == nil || app.ExitCode(err) != 2 {
		t.Errorf("missing file: %v", err)
	}
	_, _, err = run(t, "", "mutate", "-f", "-")
	if err != nil {
		t.Errorf("empty stdin: %v", err)
	}
}

// vmDocs keeps the VirtualMachine and VirtualMachineInstance documents of a
// multi-document YAML stream, in order, joined as the CLI joins them.
func vmDocs(stream string) string {
	var keep []string
	for _, d := range strings.Split(stream, "---\n") {
		if strings.Contains(d, "\nkind: VirtualMachine\n") || strings.Contains(d, "\nkind: VirtualMachineInstance\n") {
			keep = append(keep, d)
		}
	}
	return strings.Join(keep, "---\n")
}

// `kvnet version` names the version, commit and Go version; -o json is the
// same facts for scripts, and an unknown format is refused by flag name.
func TestVersion(t *testing.T) {
	out, _, err := run(t, "", "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kvnet dev", "commit unknown", runtime.Version()} {
		if !strings.Contains(out, want) {
			t.Errorf("version output %q lacks %q", out, want)
		}
	}
	out, _, err = run(t, "", "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(out), &info); err != nil || info["version"] != "dev" || info["goVersion"] != runtime.Version() {
		t.Errorf("version -o json = %q (%v)", out, err)
	}
	if _, _, err := run(t, "", "version", "-o", "xml"); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Errorf("version -o xml: err = %v, want one naming --output", err)
	}
}

// Both commands refuse plain-HTTP metrics on a non-loopback address before
// they read anything else, naming the flags; --metrics-secure alone means
// true (the default).
func TestMetricsFlagsRefusePlainHTTPOffLoopback(t *testing.T) {
	for _, cmd := range []string{"webhook", "proxy"} {
		for _, args := range [][]string{
			{"--metrics-secure=false"},
			{"--metrics-secure=false", "--metrics-bind-address=0.0.0.0:8080"},
			{"--metrics-secure=false", "--metrics-bind-address=192.0.2.1:8080"},
		} {
			_, _, err := run(t, "", append([]string{cmd}, args...)...)
			if err == nil || !strings.Contains(err.Error(), "--metrics-bind-address") || !strings.Contains(err.Error(), "--metrics-secure=false") || !strings.Contains(err.Error(), "loopback") {
				t.Errorf("kvnet %s %v: err = %v, want the loopback refusal naming both flags", cmd, args, err)
			}
		}
	}
	// Accepted: the run goes on to its next step and fails there instead
	// (no config file here, no --advertise-address).
	for cmd, next := range map[string]string{"webhook": "config", "proxy": "--advertise-address"} {
		for _, args := range [][]string{
			{"--metrics-secure=false", "--metrics-bind-address=127.0.0.1:8080", "--config=/nonexistent/config.yaml"},
			{"--metrics-secure", "--config=/nonexistent/config.yaml"},
		} {
			if cmd == "proxy" {
				args = args[:len(args)-1]
			}
			_, _, err := run(t, "", append([]string{cmd}, args...)...)
			if err == nil || strings.Contains(err.Error(), "--metrics") || !strings.Contains(err.Error(), next) {
				t.Errorf("kvnet %s %v: err = %v, want it past the metrics flags (failing on %s)", cmd, args, err, next)
			}
		}
	}
}

// kvnet proxy does not start with source listeners open to any client: the
// ranges are required, and 0.0.0.0/0 is how a lab says "any" aloud.
func TestProxyRequiresAllowedSources(t *testing.T) {
	_, _, err := run(t, "", "proxy", "--advertise-address=127.0.0.1", "--metrics-bind-address=0")
	if err == nil || !strings.Contains(err.Error(), "--allowed-sources") {
		t.Fatalf("kvnet proxy without --allowed-sources: err = %v, want the flag named", err)
	}
	_, _, err = run(t, "", "proxy", "--advertise-address=127.0.0.1", "--metrics-bind-address=0", "--allowed-sources=0.0.0.0/0", "--peers=/nonexistent")
	if err == nil || strings.Contains(err.Error(), "--allowed-sources") || !strings.Contains(err.Error(), "--peers") {
		t.Fatalf("kvnet proxy --allowed-sources=0.0.0.0/0: err = %v, want it past the flag (failing on --peers)", err)
	}
}

// The profiles have no authentication: kvnet webhook serves them only on a
// loopback address, and refuses any other before it reads anything else.
func TestPprofOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{":6060", "0.0.0.0:6060", "[::]:6060", "192.0.2.1:6060", "kvnet.example:6060", "6060"} {
		_, _, err := run(t, "", "webhook", "--pprof-bind-address="+addr, "--config=/nonexistent/config.yaml")
		if err == nil || !strings.Contains(err.Error(), "--pprof-bind-address") || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("--pprof-bind-address=%s: err = %v, want the loopback refusal naming the flag", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:6060", "[::1]:6060", "localhost:6060", ""} {
		_, _, err := run(t, "", "webhook", "--pprof-bind-address="+addr, "--config=/nonexistent/config.yaml")
		if err == nil || strings.Contains(err.Error(), "pprof") || !strings.Contains(err.Error(), "config") {
			t.Errorf("--pprof-bind-address=%q: err = %v, want it past the flag (failing on the config)", addr, err)
		}
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	neturl "net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/test/framework"
)

// macsMissedMetric and macsMissedLog are what kvnet says when kubemacpool
// does not see the interfaces it added and nobody gives them a MAC;
// macsAskedMetric and macsAskedLog when kvnet asks kubemacpool for them.
const (
	macsMissedMetric = "kvnet_vm_interfaces_missed_by_mac_pool_total"
	macsMissedLog    = "kubemacpool does not see the interfaces kvnet added: they get no MAC from its pool"
	macsAskedMetric  = "kvnet_mac_pool_asks_total"
	macsLeftMetric   = "kvnet_vm_interfaces_left_to_mac_pool_total"
	macsLeftLog      = "leaving the MACs of the interfaces kvnet added to kubemacpool, which the API server calls after kvnet"
	macsAskedLog     = "asked kubemacpool for the MACs of the interfaces kvnet added, which it does not see"
)

// macOrder is one way the API server calls kubemacpool and kvnet.
type macOrder struct {
	name, doc string
	// kvnetFirst moves kvnet's configuration to a name that sorts before
	// kubemacpool-mutator (kubemacpool's cannot be renamed).
	kvnetFirst bool
	// ifNeeded sets reinvocationPolicy IfNeeded on kubemacpool's VM
	// webhook, as docs/peers.md tells an admin to.
	ifNeeded bool
	// seq keeps the owners' MACs of one order apart from another's (the
	// VMs of each stay until the test ends).
	seq int
}

// macVM is one of the 20 VMs and what it must end with.
type macVM struct {
	ns, name, kind string
	// injected are the networks kvnet adds with no MAC, added all it
	// adds (the injected and one with the owner's MAC from
	// kvnet.io/networks); user the MACs the owner asks for, by interface
	// (in its spec or in kvnet.io/networks).
	injected, added []string
	user            map[string]string
}

// kubemacpool v0.51.1 run as its config/ deploys it, beside kvnet and
// KubeVirt's virt-controller and virt-api, in both webhook orders (and
// kubemacpool first with the reinvocation policy docs/peers.md tells an
// admin to set). 20 VMs created through the API server, some with a
// network injected by rule, some by kvnet.io/networks, some with MACs
// their owner set (on an interface, and asked for in kvnet.io/networks),
// each get a MAC on every interface, all distinct, all in
// its range but the owner's; no MAC changes across an update of every VM,
// a stop and start, and a restart of kubemacpool and of kvnet; a network
// asked for on an update gets a pool MAC too. kubemacpool's controller
// commits every MAC as its VM's. Where kubemacpool does not see the
// interfaces kvnet added (it runs first and is not called again), kvnet
// calls its webhook itself; either way kvnet says what it did in
// kvnet.io/mutations, a metric and a log line.
// A second VM asking for a MAC another holds, one kvnet set or one from
// the pool, is refused with a message naming the MAC and the holder.
//
// docs/peers.md's kubemacpool table is what this test saw
// (KVNET_UPDATE_DOCS=1 rewrites it).
func TestBesideKubemacpool(t *testing.T) {
	var rows []string
	for n, o := range []macOrder{
		{name: "kvnet-first", doc: "kvnet, then kubemacpool", kvnetFirst: true},
		{name: "kubemacpool-first", doc: "kubemacpool (as shipped: reinvocation Never), then kvnet"},
		{name: "kubemacpool-first-reinvoked", doc: "kubemacpool (reinvocationPolicy IfNeeded), then kvnet", ifNeeded: true},
	} {
		o.seq = n
		t.Run(o.name, func(t *testing.T) { rows = append(rows, besideKubemacpool(t, o)...) })
	}
	if !t.Failed() {
		framework.CheckDocTable(t, "kubemacpool", []string{"order", "VM", "MACs after create", "after an update, a stop and start, a restart of kubemacpool, of kvnet", "kvnet.io/mutations", "a second VM asking for its MAC"}, rows)
	}
}

func besideKubemacpool(t *testing.T, o macOrder) []string {
	ctx := context.Background()
	if o.kvnetFirst {
		moveKvnetFirst(t)
	}
	k, err := framework.StartKubemacpool(ctx, env.Config, env.Client, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	if o.ifNeeded {
		setKubemacpoolReinvocation(t)
	}
	ruleNS := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	plainNS := env.NewNamespace(t, nil)
	env.CreateNAD(t, ruleNS, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	for _, n := range []string{"extra", "fixed"} {
		env.CreateNAD(t, plainNS, n, "", fmt.Sprintf(bridgeConfig, n))
	}
	sees := o.kvnetFirst || o.ifNeeded
	waitMACPoolCached(t, plainNS, sees)
	missed := leftToPeer(t, macsMissedMetric, peers.Kubemacpool)
	asked := askedOfPool(t, "answered")
	left := leftToPeer(t, macsLeftMetric, peers.Kubemacpool)

	vms := createMACVMs(t, ruleNS, plainNS, o.seq)
	macs := map[string]map[string]string{} // VM -> interface -> MAC
	for _, vm := range vms {
		macs[vm.name] = checkMACsOnCreate(t, vm, sees)
	}
	checkDistinct(t, macs)
	// kvnet steps aside where kubemacpool sees its interfaces, and asks it
	// where it does not; either way it says so.
	wantAsked, wantLeft, wantLeftLogs := 0, 0, 0
	for _, vm := range vms {
		switch {
		case !sees && len(vm.added) > 0:
			wantAsked++
		case sees && len(vm.injected) > 0:
			wantLeft += len(vm.injected)
			wantLeftLogs++
		}
	}
	if d := leftToPeer(t, macsLeftMetric, peers.Kubemacpool) - left; int(d) != wantLeft {
		t.Errorf("%s rose by %v, want %d", macsLeftMetric, d, wantLeft)
	}
	if n := env.Logs.Count(macsLeftLog, "namespace", ruleNS) + env.Logs.Count(macsLeftLog, "namespace", plainNS); n != wantLeftLogs {
		t.Errorf("%d log lines say kvnet left MACs to kubemacpool, want %d", n, wantLeftLogs)
	}
	if d := leftToPeer(t, macsMissedMetric, peers.Kubemacpool) - missed; d != 0 {
		t.Errorf("%s rose by %v: kvnet left interfaces without a MAC", macsMissedMetric, d)
	}
	if d := askedOfPool(t, "answered") - asked; int(d) != wantAsked {
		t.Errorf("%s{outcome=answered} rose by %v, want %d (a call per VM kvnet added interfaces to)", macsAskedMetric, d, wantAsked)
	}
	if n := env.Logs.Count(macsMissedLog, "namespace", ruleNS) + env.Logs.Count(macsMissedLog, "namespace", plainNS); n != 0 {
		t.Errorf("%d log lines say kubemacpool missed kvnet's interfaces", n)
	}
	if n := env.Logs.Count(macsAskedLog, "namespace", ruleNS) + env.Logs.Count(macsAskedLog, "namespace", plainNS); n != wantAsked {
		t.Errorf("%d log lines say kvnet asked kubemacpool, want %d", n, wantAsked)
	}
	checkPoolCommitted(t, k, vms, macs)
	refusals := checkHeldMACsRefused(t, vms, macs)

	// An update of every VM, a stop and start of one of each kind, a
	// restart of kubemacpool and another update: no MAC moves.
	touchVMs(t, vms, "1")
	checkMACsKept(t, vms, macs, "an update")
	for _, vm := range vms[:4] {
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyAlways)
		checkVMIMACs(t, vm, macs[vm.name])
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyHalted)
		waitGone(t, &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: vm.ns, Name: vm.name}})
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyAlways)
		checkVMIMACs(t, vm, macs[vm.name])
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyHalted)
	}
	checkMACsKept(t, vms, macs, "a stop and start")
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	touchVMs(t, vms, "2")
	checkMACsKept(t, vms, macs, "a restart of kubemacpool and an update")
	// kvnet restarted: a new kvnet process, its caches filled afresh,
	// answers both of kvnet's configurations instead.
	answerWithNewKvnet(t)
	touchVMs(t, vms, "3")
	checkMACsKept(t, vms, macs, "a restart of kvnet and an update")
	// An update that asks for another network: kvnet adds its interface on
	// the UPDATE, and it gets a pool MAC as on a CREATE.
	addedOnUpdate(t, k, vms[4], macs, sees)
	if !sees {
		unreachableKubemacpool(t, plainNS)
	}

	var rows []string
	for _, kind := range []string{"pod network only", "a network by rule", "a network by kvnet.io/networks", "MACs set by the owner"} {
		i := slices.IndexFunc(vms, func(v macVM) bool { return v.kind == kind })
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | unchanged | %s | %s |", o.doc, kind, describeMACs(vms[i], macs[vms[i].name]), recordOf(t, vms[i]), refusals[kind]))
	}
	return rows
}

// createMACVMs creates 20 halted VMs, five of each kind: the pod network
// only, a network injected by rule (in ruleNS), one by kvnet.io/networks,
// and MACs set by the owner outside kubemacpool's range (the pod
// interface's macAddress, and one asked for in kvnet.io/networks).
func createMACVMs(t *testing.T, ruleNS, plainNS string, seq int) []macVM {
	var vms []macVM
	for i := range 20 {
		vm := macVM{ns: plainNS, name: fmt.Sprintf("vm%02d", i)}
		podMAC, annotations := "", ""
		switch i % 4 {
		case 0:
			vm.kind = "pod network only"
		case 1:
			vm.kind, vm.ns, vm.injected, vm.added = "a network by rule", ruleNS, []string{"storage"}, []string{"storage"}
		case 2:
			vm.kind, vm.injected, vm.added = "a network by kvnet.io/networks", []string{"extra"}, []string{"extra"}
			annotations = `kvnet.io/networks: '[{"name":"extra","nad":"extra"}]'`
		case 3:
			vm.kind, vm.added = "MACs set by the owner", []string{"fixed"}
			vm.user = map[string]string{"default": fmt.Sprintf("0a:58:0a:%02x:00:%02x", seq, i), "fixed": fmt.Sprintf("0a:58:0a:%02x:01:%02x", seq, i)}
			podMAC = `, macAddress: "` + vm.user["default"] + `"`
			annotations = `kvnet.io/networks: '[{"name":"fixed","nad":"fixed","mac":"` + vm.user["fixed"] + `"}]'`
		}
		if _, err := createVM(t, vm.ns, macVMYAML(vm.name, podMAC, annotations)); err != nil {
			t.Fatalf("creating %s (%s): %v", vm.name, vm.kind, err)
		}
		vms = append(vms, vm)
	}
	return vms
}

// macVMYAML is vmYAML's VM, halted, its pod interface with podMAC's
// extra fields.
func macVMYAML(name, podMAC, annotations string) string {
	y := strings.Replace(vmYAML(name, "", "", annotations), "runStrategy: Always", "runStrategy: Halted", 1)
	return strings.Replace(y, "{name: default, masquerade: {}}", "{name: default, masquerade: {}"+podMAC+"}", 1)
}

// interfaceMACs reads a stored VM's MAC per interface.
func interfaceMACs(t *testing.T, ns, name string) (map[string]string, *kubevirtv1.VirtualMachine) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
		out[iface.Name] = iface.MacAddress
	}
	return out, &vm
}

// checkMACsOnCreate checks one VM as stored: the owner's MACs as asked;
// every other interface a MAC in kubemacpool's range; kvnet's record of
// its interfaces' MACs: left to kubemacpool where it sees them (sees),
// asked of it where it does not.
func checkMACsOnCreate(t *testing.T, want macVM, sees bool) map[string]string {
	t.Helper()
	macs, vm := interfaceMACs(t, want.ns, want.name)
	for iface, mac := range macs {
		switch {
		case want.user[iface] != "":
			if mac != want.user[iface] {
				t.Errorf("%s interface %s: MAC %q, want the owner's %s", want.name, iface, mac, want.user[iface])
			}
		case !strings.HasPrefix(mac, "02:"):
			t.Errorf("%s interface %s: MAC %q, want one from kubemacpool's range %s-%s", want.name, iface, mac, framework.KubemacpoolRangeStart, framework.KubemacpoolRangeEnd)
		}
	}
	names := append([]string{"default"}, want.injected...)
	for iface := range want.user {
		names = append(names, iface)
	}
	slices.Sort(names)
	if got := slices.Sorted(maps.Keys(macs)); !slices.Equal(got, slices.Compact(names)) {
		t.Errorf("%s interfaces %v, want %v", want.name, got, slices.Compact(names))
	}
	var record []chain.Change
	_ = json.Unmarshal([]byte(vm.Annotations[chain.MutationsAnnotation]), &record)
	i := slices.IndexFunc(record, func(c chain.Change) bool { return c.Mutator == "mac-pool" })
	// Where kubemacpool sees kvnet's interfaces, kvnet says it left it
	// those without a MAC; where it does not, that it asked it for all.
	wantRecord := want.injected
	if !sees {
		wantRecord = want.added
	}
	switch {
	case len(wantRecord) == 0 && i >= 0:
		t.Errorf("%s: kvnet.io/mutations has %+v; kvnet had nothing to leave to kubemacpool or to ask of it", want.name, record[i])
	case len(wantRecord) > 0 && i < 0:
		t.Errorf("%s: kvnet.io/mutations %s says nothing of the MACs of %v", want.name, vm.Annotations[chain.MutationsAnnotation], wantRecord)
	case len(wantRecord) > 0 && sees && (record[i].LeftTo != peers.Kubemacpool || !slices.Equal(record[i].Networks, wantRecord)):
		t.Errorf("%s: kvnet.io/mutations %+v, want %v left to kubemacpool", want.name, record[i], wantRecord)
	case len(wantRecord) > 0 && !sees && (record[i].AskedOf != peers.Kubemacpool || !slices.Equal(record[i].Networks, wantRecord)):
		t.Errorf("%s: kvnet.io/mutations %+v, want %v asked of kubemacpool", want.name, record[i], wantRecord)
	}
	return macs
}

// checkDistinct fails on a MAC two interfaces share, in one VM or two.
func checkDistinct(t *testing.T, macs map[string]map[string]string) {
	t.Helper()
	seen := map[string]string{}
	for vm, ifaces := range macs {
		for iface, mac := range ifaces {
			if mac == "" {
				continue
			}
			if other, dup := seen[mac]; dup {
				t.Errorf("MAC %s on %s/%s and on %s", mac, vm, iface, other)
			}
			seen[mac] = vm + "/" + iface
		}
	}
}

// checkHeldMACsRefused creates, beside the first VM of each kind that has
// one, a VM asking for a MAC it holds: the pool's (on the pod interface's
// macAddress) and the owner's asked through kvnet.io/networks. Each must
// be refused naming the MAC and the holder. It returns, by kind, what the
// table says.
func checkHeldMACsRefused(t *testing.T, vms []macVM, macs map[string]map[string]string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kind := range []string{"pod network only", "a network by rule", "a network by kvnet.io/networks", "MACs set by the owner"} {
		i := slices.IndexFunc(vms, func(v macVM) bool { return v.kind == kind })
		holder := vms[i]
		iface, mac, podMAC, annotations := "default", macs[holder.name]["default"], "", ""
		if kind == "MACs set by the owner" {
			iface, mac = "fixed", macs[holder.name]["fixed"]
			annotations = `kvnet.io/networks: '[{"name":"fixed","nad":"fixed","mac":"` + mac + `"}]'`
		} else {
			podMAC = `, macAddress: "` + mac + `"`
		}
		_, err := createVM(t, holder.ns, macVMYAML("dup-"+holder.name, podMAC, annotations))
		want := fmt.Sprintf("MAC %s is held by VirtualMachine %s/%s (interface %s)", mac, holder.ns, holder.name, iface)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a VM asking for %s's %s MAC %s: %v, want refused: %s", holder.name, iface, mac, err, want)
			continue
		}
		// The table says it without the run's MAC and namespace.
		what := "the pool's MAC, on the pod interface"
		if iface == "fixed" {
			what = "the owner's MAC, in kvnet.io/networks"
		}
		out[kind] = fmt.Sprintf("%s: refused by kvnet, naming the MAC and %s (interface %s)", what, holder.name, iface)
	}
	return out
}

// touchVMs updates every VM as an owner would (a label), which both
// webhooks see.
func touchVMs(t *testing.T, vms []macVM, value string) {
	t.Helper()
	for _, vm := range vms {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cur kubevirtv1.VirtualMachine
			if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: vm.ns, Name: vm.name}, &cur); err != nil {
				return err
			}
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			cur.Labels["touched"] = value
			return env.Client.Update(context.Background(), &cur)
		})
		if err != nil {
			t.Fatalf("updating %s: %v", vm.name, err)
		}
	}
}

func checkMACsKept(t *testing.T, vms []macVM, macs map[string]map[string]string, after string) {
	t.Helper()
	for _, vm := range vms {
		got, _ := interfaceMACs(t, vm.ns, vm.name)
		for iface, mac := range macs[vm.name] {
			if got[iface] != mac {
				t.Errorf("after %s, %s interface %s: MAC %q, was %q", after, vm.name, iface, got[iface], mac)
			}
		}
	}
}

// checkVMIMACs waits for the VM's VMI and checks it runs with the VM's MACs.
func checkVMIMACs(t *testing.T, vm macVM, macs map[string]string) {
	t.Helper()
	vmi := waitVMI(t, vm.ns, vm.name)
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.MacAddress != macs[iface.Name] {
			t.Errorf("VMI %s interface %s: MAC %q, the VM's is %q", vm.name, iface.Name, iface.MacAddress, macs[iface.Name])
		}
	}
}

// describeMACs says, for the table, where each interface's MAC came from.
func describeMACs(vm macVM, macs map[string]string) string {
	var parts []string
	for _, iface := range slices.Sorted(maps.Keys(macs)) {
		mac := macs[iface]
		from := "kubemacpool's pool"
		switch {
		case vm.user[iface] != "":
			from = "the owner's"
		case mac == "":
			from = "none"
		}
		what := iface
		if slices.Contains(vm.injected, iface) {
			what += " (injected)"
		}
		parts = append(parts, what+": "+from)
	}
	return strings.Join(parts, ", ")
}

// recordOf is kvnet's mac-pool record on the VM, for the table.
func recordOf(t *testing.T, vm macVM) string {
	t.Helper()
	_, cur := interfaceMACs(t, vm.ns, vm.name)
	var record []chain.Change
	_ = json.Unmarshal([]byte(cur.Annotations[chain.MutationsAnnotation]), &record)
	for _, c := range record {
		switch {
		case c.Mutator == "mac-pool" && c.LeftTo != "":
			return fmt.Sprintf("`leftTo: %s` for %s, the metric, a log line", c.LeftTo, strings.Join(c.Networks, ", "))
		case c.Mutator == "mac-pool" && c.AskedOf != "":
			return fmt.Sprintf("`askedOf: %s` for %s (kvnet called its webhook), the metric, a log line", c.AskedOf, strings.Join(c.Networks, ", "))
		case c.Mutator == "mac-pool" && c.MissedBy != "":
			return fmt.Sprintf("`missedBy: %s` for %s, a warning, the metric, a log line", c.MissedBy, strings.Join(c.Networks, ", "))
		}
	}
	return "nothing of MACs"
}

// moveKvnetFirst renames kvnet's mutating configuration so that the API
// server calls it before kubemacpool-mutator, for the test, and puts it
// back after.
func moveKvnetFirst(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var kv admissionregv1.MutatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "kvnet"}, &kv); err != nil {
		t.Fatal(err)
	}
	first := kv.DeepCopy()
	first.ObjectMeta = metav1.ObjectMeta{Name: "0-kvnet"}
	if err := env.Client.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &kv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		restored := kv.DeepCopy()
		restored.ObjectMeta = metav1.ObjectMeta{Name: "kvnet"}
		if err := env.Client.Create(ctx, restored); err != nil {
			t.Errorf("putting kvnet's configuration back: %v", err)
		}
		_ = env.Client.Delete(ctx, first)
	})
}

// setKubemacpoolReinvocation sets reinvocationPolicy IfNeeded on
// kubemacpool's VM webhook, as an admin following docs/peers.md does.
func setKubemacpoolReinvocation(t *testing.T) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var c admissionregv1.MutatingWebhookConfiguration
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: framework.KubemacpoolConfiguration}, &c); err != nil {
			return err
		}
		for i := range c.Webhooks {
			if c.Webhooks[i].Name == framework.KubemacpoolVMWebhook {
				c.Webhooks[i].ReinvocationPolicy = ptr.To(admissionregv1.IfNeededReinvocationPolicy)
			}
		}
		return env.Client.Update(context.Background(), &c)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitMACPoolCached waits until kvnet's webhook informer shows kubemacpool
// registered for ns, seeing kvnet's interfaces or not.
func waitMACPoolCached(t *testing.T, ns string, sees bool) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("kvnet's cache has kubemacpool's webhook, seeing kvnet's interfaces: %v", sees), framework.CacheTimeout, func() error {
		var list admissionregv1.MutatingWebhookConfigurationList
		if err := env.Manager.GetCache().List(context.Background(), &list); err != nil {
			return err
		}
		slices.SortFunc(list.Items, func(a, b admissionregv1.MutatingWebhookConfiguration) int { return strings.Compare(a.Name, b.Name) })
		p := peers.KubemacpoolFor(list.Items, ns, nil)
		if p.Webhook == "" || p.SeesKvnetInterfaces() != sees {
			return fmt.Errorf("cached: %+v", p)
		}
		return nil
	})
}

// answerWithNewKvnet starts another kvnet process (a replica on the
// suite's policy, its caches synced from scratch) and points both of
// kvnet's webhook configurations at it, as a restarted pod behind the
// Service would answer; the suite's kvnet answers again at cleanup.
func answerWithNewKvnet(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := framework.StartReplica(env.Config, framework.ReplicaOptions{
		ConfigPath: path, LeaderElectionID: "kvnet-restarted-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")),
		Name: "kvnet-restarted", CertDir: env.Env.WebhookInstallOptions.LocalServingCertDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("the restarted kvnet: %v", err)
		}
	})
	if !r.Manager.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("the restarted kvnet's caches did not sync")
	}
	var mutating admissionregv1.MutatingWebhookConfigurationList
	if err := env.Client.List(ctx, &mutating); err != nil {
		t.Fatal(err)
	}
	var validating admissionregv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "kvnet"}, &validating); err != nil {
		t.Fatal(err)
	}
	for i := range mutating.Items {
		m := &mutating.Items[i]
		if !slices.ContainsFunc(m.Webhooks, func(w admissionregv1.MutatingWebhook) bool { return w.Name == peers.KvnetVMWebhook }) {
			continue
		}
		before := m.DeepCopy()
		for j := range m.Webhooks {
			m.Webhooks[j].ClientConfig.URL = rehost(t, m.Webhooks[j].ClientConfig.URL, r.Addr)
		}
		if err := env.Client.Update(ctx, m); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { restoreURLs(t, &admissionregv1.MutatingWebhookConfiguration{}, before) })
	}
	before := validating.DeepCopy()
	for j := range validating.Webhooks {
		validating.Webhooks[j].ClientConfig.URL = rehost(t, validating.Webhooks[j].ClientConfig.URL, r.Addr)
	}
	if err := env.Client.Update(ctx, &validating); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreURLs(t, &admissionregv1.ValidatingWebhookConfiguration{}, before) })
}

// rehost is url with its host:port replaced by addr.
func rehost(t *testing.T, url *string, addr string) *string {
	t.Helper()
	if url == nil {
		t.Fatal("kvnet's webhook has no URL to point elsewhere")
	}
	u, err := neturl.Parse(*url)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return ptr.To(u.String())
}

// restoreURLs puts a configuration's webhooks back as they were.
func restoreURLs(t *testing.T, cur, before client.Object) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(before), cur); err != nil {
			return err
		}
		switch c := cur.(type) {
		case *admissionregv1.MutatingWebhookConfiguration:
			c.Webhooks = before.(*admissionregv1.MutatingWebhookConfiguration).Webhooks
		case *admissionregv1.ValidatingWebhookConfiguration:
			c.Webhooks = before.(*admissionregv1.ValidatingWebhookConfiguration).Webhooks
		}
		return env.Client.Update(context.Background(), cur)
	})
	if err != nil {
		t.Errorf("pointing %s back at the suite's kvnet: %v", before.GetName(), err)
	}
}

// askedOfPool reads kvnet_mac_pool_asks_total for kubemacpool and outcome.
func askedOfPool(t *testing.T, outcome string) float64 {
	t.Helper()
	return counterWith(t, macsAskedMetric, map[string]string{"peer": peers.Kubemacpool, "outcome": outcome})
}

// checkPoolCommitted checks that kubemacpool knows every MAC of every VM
// as that VM's, those of the interfaces kvnet added included: its VM
// controller logs each MAC it commits to its pool with the VM
// ("committing macs to macPoolMap", pkg/pool-manager MarkVMAsReady). A MAC
// it allocated and never committed it would free after its --wait-time,
// for another VM to get.
func checkPoolCommitted(t *testing.T, k *framework.Kubemacpool, vms []macVM, macs map[string]map[string]string) {
	t.Helper()
	const commitMsg = "committing macs to macPoolMap according to the current vm interfaces"
	framework.Eventually(t, "kubemacpool committed every VM's MACs", framework.CacheTimeout, func() error {
		b, err := os.ReadFile(k.LogPath)
		if err != nil {
			return err
		}
		committed := map[string]bool{} // "vm/<ns>/<name> <mac>"
		for _, line := range strings.Split(string(b), "\n") {
			var l struct {
				Msg    string                     `json:"msg"`
				VM     string                     `json:"vmFullName"`
				Commit map[string]json.RawMessage `json:"macsMapToCommit"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || l.Msg != commitMsg {
				continue
			}
			for mac := range l.Commit {
				committed[l.VM+" "+strings.ToLower(mac)] = true
			}
		}
		for _, vm := range vms {
			for iface, mac := range macs[vm.name] {
				if !committed["vm/"+vm.ns+"/"+vm.name+" "+strings.ToLower(mac)] {
					return fmt.Errorf("%s/%s interface %s: kubemacpool has not committed its MAC %s", vm.ns, vm.name, iface, mac)
				}
			}
		}
		return nil
	})
}

// addedOnUpdate asks for network extra on vm (a pod-network-only VM, not
// the one the table describes, in the
// namespace that has its NAD) in kvnet.io/networks: kvnet adds the
// interface on the UPDATE, and kubemacpool gives it a MAC from its pool,
// distinct from every other, which it commits as the VM's; the VM's
// other MACs stay.
func addedOnUpdate(t *testing.T, k *framework.Kubemacpool, vm macVM, macs map[string]map[string]string, sees bool) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur kubevirtv1.VirtualMachine
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: vm.ns, Name: vm.name}, &cur); err != nil {
			return err
		}
		cur.Annotations["kvnet.io/networks"] = `[{"name":"extra","nad":"extra"}]`
		return env.Client.Update(context.Background(), &cur)
	})
	if err != nil {
		t.Fatalf("asking %s for network extra: %v", vm.name, err)
	}
	got, cur := interfaceMACs(t, vm.ns, vm.name)
	if got["default"] != macs[vm.name]["default"] {
		t.Errorf("%s: the pod interface's MAC moved from %s to %s on an update adding a network", vm.name, macs[vm.name]["default"], got["default"])
	}
	if !strings.HasPrefix(got["extra"], "02:") {
		t.Fatalf("%s: the interface kvnet added on an update has MAC %q, want one from kubemacpool's range (interfaces %v, kvnet.io/mutations %s)", vm.name, got["extra"], got, cur.Annotations[chain.MutationsAnnotation])
	}
	var record []chain.Change
	_ = json.Unmarshal([]byte(cur.Annotations[chain.MutationsAnnotation]), &record)
	want := chain.Change{Mutator: "mac-pool", Networks: []string{"extra"}, LeftTo: peers.Kubemacpool}
	if !sees {
		want.LeftTo, want.AskedOf = "", peers.Kubemacpool
	}
	if !slices.ContainsFunc(record, func(c chain.Change) bool {
		return c.Mutator == want.Mutator && c.LeftTo == want.LeftTo && c.AskedOf == want.AskedOf && slices.Equal(c.Networks, want.Networks)
	}) {
		t.Errorf("%s: kvnet.io/mutations %s has no %+v", vm.name, cur.Annotations[chain.MutationsAnnotation], want)
	}
	macs[vm.name] = got
	checkDistinct(t, macs)
	checkPoolCommitted(t, k, []macVM{vm}, macs)
}

// unreachableKubemacpool registers kubemacpool's VM webhook at an address
// nothing answers, with failurePolicy Ignore: the API server passes the VM
// without it, kvnet's own call fails too, and kvnet admits the VM with its
// interface MAC-less and says so (missedBy, the metrics, a log line). The
// configuration is put back after.
func unreachableKubemacpool(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	var before admissionregv1.MutatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: framework.KubemacpoolConfiguration}, &before); err != nil {
		t.Fatal(err)
	}
	defer restoreURLs(t, &admissionregv1.MutatingWebhookConfiguration{}, before.DeepCopy())
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var c admissionregv1.MutatingWebhookConfiguration
		if err := env.Client.Get(ctx, client.ObjectKey{Name: framework.KubemacpoolConfiguration}, &c); err != nil {
			return err
		}
		for i := range c.Webhooks {
			if c.Webhooks[i].Name == framework.KubemacpoolVMWebhook {
				c.Webhooks[i].FailurePolicy = ptr.To(admissionregv1.Ignore)
				c.Webhooks[i].ClientConfig.URL = rehost(t, c.Webhooks[i].ClientConfig.URL, "127.0.0.1:1")
			}
		}
		return env.Client.Update(ctx, &c)
	})
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "kvnet's cache has kubemacpool's webhook unreachable, failurePolicy Ignore", framework.CacheTimeout, func() error {
		var list admissionregv1.MutatingWebhookConfigurationList
		if err := env.Manager.GetCache().List(ctx, &list); err != nil {
			return err
		}
		slices.SortFunc(list.Items, func(a, b admissionregv1.MutatingWebhookConfiguration) int { return strings.Compare(a.Name, b.Name) })
		p := peers.KubemacpoolFor(list.Items, ns, nil)
		if p.Hook == nil || p.FailsClosed() || !strings.Contains(ptr.Deref(p.Hook.ClientConfig.URL, ""), ":1/") {
			return fmt.Errorf("cached: %+v", p)
		}
		return nil
	})
	failed, missed := askedOfPool(t, "failed"), leftToPeer(t, macsMissedMetric, peers.Kubemacpool)
	if _, err := createVM(t, ns, macVMYAML("unreachable", "", `kvnet.io/networks: '[{"name":"extra","nad":"extra"}]'`)); err != nil {
		t.Fatalf("creating a VM while kubemacpool is unreachable, failurePolicy Ignore: %v", err)
	}
	got, vm := interfaceMACs(t, ns, "unreachable")
	if got["extra"] != "" || got["default"] != "" {
		t.Errorf("MACs %v: nobody could give any", got)
	}
	var record []chain.Change
	_ = json.Unmarshal([]byte(vm.Annotations[chain.MutationsAnnotation]), &record)
	if !slices.ContainsFunc(record, func(c chain.Change) bool {
		return c.Mutator == "mac-pool" && c.MissedBy == peers.Kubemacpool && slices.Equal(c.Networks, []string{"extra"})
	}) {
		t.Errorf("kvnet.io/mutations %s: want extra missed by kubemacpool", vm.Annotations[chain.MutationsAnnotation])
	}
	if d := askedOfPool(t, "failed") - failed; d != 1 {
		t.Errorf("%s{outcome=failed} rose by %v, want 1", macsAskedMetric, d)
	}
	if d := leftToPeer(t, macsMissedMetric, peers.Kubemacpool) - missed; d != 1 {
		t.Errorf("%s rose by %v, want 1", macsMissedMetric, d)
	}
	if n := env.Logs.Count(macsMissedLog, "namespace", ns, "name", "unreachable"); n != 1 {
		t.Errorf("%d log lines say kubemacpool missed the VM's interface, want 1", n)
	}
}

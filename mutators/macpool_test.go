package mutators_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/mutators"
)

// What kvnet records of the interfaces it added, by where kubemacpool's VM
// webhook runs: nothing without it; left to it when it sees them (after
// kvnet, or reinvoked); missed, with a warning, when it ran before and is
// not called again. An interface that has a MAC (here, asked for in
// kvnet.io/networks) is no concern of the pool's.
func TestMACPool(t *testing.T) {
	kmp := func(name string, policy *admissionregv1.ReinvocationPolicyType) admissionregv1.MutatingWebhookConfiguration {
		return kubemacpoolConfig(name, policy, nil)
	}
	vm := macPoolVM("")
	for name, c := range map[string]struct {
		webhooks []admissionregv1.MutatingWebhookConfiguration
		want     []chain.Change
		warned   bool
	}{
		"no kubemacpool": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kvnet}},
		"kubemacpool after kvnet": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kvnet, kmp("zz-kubemacpool", nil)},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, LeftTo: peers.Kubemacpool}}},
		"kubemacpool first, reinvoked": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", ptr.To(admissionregv1.IfNeededReinvocationPolicy)), kvnet},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, LeftTo: peers.Kubemacpool}}},
		"kubemacpool first, as shipped": {webhooks: []admissionregv1.MutatingWebhookConfiguration{kmp("kubemacpool-mutator", nil), kvnet},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, MissedBy: peers.Kubemacpool}}, warned: true},
	} {
		t.Run(name, func(t *testing.T) {
			_, req := vmRequest(t, vm, mustConfig(t, ""))
			facts := testFacts()
			facts.Webhooks = c.webhooks
			req.Facts = facts
			for _, m := range []chain.VMMutator{mutators.NetworkInjector{}, mutators.Addresses{}, mutators.MACPool{}} {
				if err := m.Mutate(context.Background(), req); err != nil {
					t.Fatalf("%s: %v", m.Name(), err)
				}
			}
			checkMACPoolRecord(t, req, c.want, c.warned)
		})
	}
}

// kvnet is kvnet's own configuration, holding its VM webhook.
var kvnet = admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kvnet"}, Webhooks: []admissionregv1.MutatingWebhook{{Name: peers.KvnetVMWebhook}}}

// kubemacpoolConfig is kubemacpool's configuration named name, its VM
// webhook with the policies given (nil: the API server's defaults).
func kubemacpoolConfig(name string, reinvocation *admissionregv1.ReinvocationPolicyType, failure *admissionregv1.FailurePolicyType) admissionregv1.MutatingWebhookConfiguration {
	return admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: []admissionregv1.MutatingWebhook{{
		Name: peers.KubemacpoolVMWebhook, ReinvocationPolicy: reinvocation, FailurePolicy: failure,
		Rules: []admissionregv1.RuleWithOperations{{
			Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
			Rule:       admissionregv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"}},
		}},
	}}}
}

// macPoolVM is a VM asking, in kvnet.io/networks, for network a without a
// MAC and b with one; podMAC adds to its pod interface.
func macPoolVM(podMAC string) string {
	return `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web
  annotations:
    kvnet.io/networks: '[{"name":"a","nad":"br"},{"name":"b","nad":"vf","mac":"02:00:00:00:00:0b"}]'
spec:
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: default, masquerade: {}` + podMAC + `}]
      networks: [{name: default, pod: {}}]
`
}

// checkMACPoolRecord checks the request's mac-pool changes against want,
// and that it warned of MAC-less interfaces exactly when warned.
func checkMACPoolRecord(t *testing.T, req *chain.Request, want []chain.Change, warned bool) {
	t.Helper()
	var got []chain.Change
	for _, ch := range req.Changes {
		if ch.Mutator == "mac-pool" {
			got = append(got, ch)
		}
	}
	if !equalChanges(got, want) {
		t.Errorf("mac-pool changes = %+v, want %+v", got, want)
	}
	if w := strings.Contains(strings.Join(req.Warnings, "\n"), "get no MAC from kubemacpool"); w != warned {
		t.Errorf("warned = %v (%q), want %v", w, req.Warnings, warned)
	}
}

func equalChanges(a, b []chain.Change) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Mutator != b[i].Mutator || a[i].LeftTo != b[i].LeftTo || a[i].MissedBy != b[i].MissedBy || a[i].AskedOf != b[i].AskedOf || strings.Join(a[i].Networks, ",") != strings.Join(b[i].Networks, ",") {
			return false
		}
	}
	return true
}

// callerFunc is a mutators.WebhookCaller answering as the test says.
type callerFunc func(*admissionregv1.MutatingWebhook, *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error)

func (f callerFunc) Call(_ context.Context, hook *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	return f(hook, req)
}

// kubemacpoolAnswer answers as kubemacpool v0.51.1 does: a MAC for every
// interface without one, by index, and its transaction annotation.
func kubemacpoolAnswer(t *testing.T, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := json.Unmarshal(req.Object.Raw, &vm); err != nil {
		t.Fatalf("the VM kvnet sent: %v", err)
	}
	ops := []map[string]any{{"op": "add", "path": "/metadata/annotations/kubemacpool.io~1transaction-timestamp", "value": "2026-12-06T17:00:00.123456789Z"}}
	for i, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
		if iface.MacAddress == "" {
			ops = append(ops, map[string]any{"op": "add", "path": fmt.Sprintf("/spec/template/spec/domain/devices/interfaces/%d/macAddress", i), "value": fmt.Sprintf("02:da:00:00:00:%02x", i)})
		}
	}
	patch, _ := json.Marshal(ops)
	return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Patch: patch, PatchType: ptr.To(admissionv1.PatchTypeJSONPatch)}
}

// Where kubemacpool runs first and is not called again, kvnet calls its
// webhook with the VM as kvnet leaves it and takes the MACs it gives the
// interfaces kvnet added, and its transaction annotation, nothing else;
// a refusal is the VM's; a failure refuses the VM under failurePolicy Fail
// and leaves the interfaces MAC-less, said as missed, under Ignore.
func TestMACPoolAsksKubemacpool(t *testing.T) {
	vm := macPoolVM(`, macAddress: "02:da:00:00:00:aa"`)
	ignore := admissionregv1.Ignore
	bad := func(patch string) callerFunc {
		return func(_ *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
			return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Patch: []byte(patch), PatchType: ptr.To(admissionv1.PatchTypeJSONPatch)}, nil
		}
	}
	for name, c := range map[string]struct {
		caller  func(t *testing.T) callerFunc
		policy  *admissionregv1.FailurePolicyType
		macs    map[string]string // interface -> MAC after
		want    []chain.Change
		refusal int32 // the refusal's code; 0: none
		failed  bool  // kvnet's own failure (500)
		warned  bool
	}{
		"answered": {
			caller: func(t *testing.T) callerFunc {
				return func(hook *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
					if hook.Name != peers.KubemacpoolVMWebhook || req.UID != "review-1" || req.Namespace != "default" || req.Operation != admissionv1.Create {
						t.Errorf("called %s with %+v", hook.Name, req)
					}
					return kubemacpoolAnswer(t, req), nil
				}
			},
			macs: map[string]string{"default": "02:da:00:00:00:aa", "a": "02:da:00:00:00:01", "b": "02:00:00:00:00:0b"},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a", "b"}, AskedOf: peers.Kubemacpool}},
		},
		"refused by kubemacpool": {
			caller: func(*testing.T) callerFunc {
				return func(_ *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
					return &admissionv1.AdmissionResponse{UID: req.UID, Result: &metav1.Status{Code: 422, Message: "duplicate interface names"}}, nil
				}
			},
			refusal: 422,
		},
		"kubemacpool failing, failurePolicy Fail": {
			caller: func(*testing.T) callerFunc {
				return func(*admissionregv1.MutatingWebhook, *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
					return nil, errors.New("connection refused")
				}
			},
			failed: true,
		},
		"kubemacpool failing, failurePolicy Ignore": {
			caller: func(*testing.T) callerFunc {
				return func(*admissionregv1.MutatingWebhook, *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
					return nil, errors.New("connection refused")
				}
			},
			policy: &ignore,
			macs:   map[string]string{"default": "02:da:00:00:00:aa", "a": "", "b": "02:00:00:00:00:0b"},
			want:   []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, MissedBy: peers.Kubemacpool}},
			warned: true,
		},
		"a patch beyond the VM's interfaces changes nothing": {
			caller: func(*testing.T) callerFunc {
				return bad(`[{"op":"add","path":"/spec/template/spec/domain/devices/interfaces/1/macAddress","value":"02:da:00:00:00:01"},{"op":"add","path":"/spec/template/spec/domain/devices/interfaces/9/macAddress","value":"02:da:00:00:00:09"}]`)
			},
			policy: &ignore,
			macs:   map[string]string{"default": "02:da:00:00:00:aa", "a": "", "b": "02:00:00:00:00:0b"},
			want:   []chain.Change{{Mutator: "mac-pool", Networks: []string{"a"}, MissedBy: peers.Kubemacpool}},
			warned: true,
		},
		"only MACs of interfaces without one are taken": {
			caller: func(*testing.T) callerFunc {
				return bad(`[{"op":"replace","path":"/spec/template/spec/domain/devices/interfaces/0/macAddress","value":"02:da:00:00:00:ff"},{"op":"add","path":"/spec/template/spec/domain/devices/interfaces/1/macAddress","value":"02:da:00:00:00:01"},{"op":"add","path":"/spec/runStrategy","value":"Always"},{"op":"add","path":"/metadata/annotations/kubemacpool.io~1transaction-timestamp","value":"2026-12-06T17:00:00Z"}]`)
			},
			macs: map[string]string{"default": "02:da:00:00:00:aa", "a": "02:da:00:00:00:01", "b": "02:00:00:00:00:0b"},
			want: []chain.Change{{Mutator: "mac-pool", Networks: []string{"a", "b"}, AskedOf: peers.Kubemacpool}},
		},
		"a MAC that is not one fails the call": {
			caller: func(*testing.T) callerFunc {
				return bad(`[{"op":"add","path":"/spec/template/spec/domain/devices/interfaces/1/macAddress","value":"not-a-mac"}]`)
			},
			failed: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, req := vmRequest(t, vm, mustConfig(t, ""))
			req.Review = &admissionv1.AdmissionRequest{UID: "review-1", Namespace: "default", Name: "web", Operation: admissionv1.Create}
			facts := testFacts()
			facts.Webhooks = []admissionregv1.MutatingWebhookConfiguration{kubemacpoolConfig("kubemacpool-mutator", nil, c.policy), kvnet}
			req.Facts = facts
			var err error
			for _, m := range []chain.VMMutator{mutators.NetworkInjector{}, mutators.Addresses{}, mutators.MACPool{Webhooks: c.caller(t)}} {
				if err = m.Mutate(context.Background(), req); err != nil {
					break
				}
			}
			var refusal *chain.Refusal
			switch {
			case c.refusal != 0:
				if !errors.As(err, &refusal) || refusal.Status().Code != c.refusal || !strings.Contains(err.Error(), peers.KubemacpoolVMWebhook) {
					t.Fatalf("err = %v, want a %d refusal naming kubemacpool's webhook", err, c.refusal)
				}
				return
			case c.failed:
				if err == nil || errors.As(err, &refusal) || !strings.Contains(err.Error(), "kubemacpool") {
					t.Fatalf("err = %v, want kvnet's own failure naming kubemacpool", err)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			for iface, mac := range c.macs {
				if _, got := req.Interface(iface); got == nil || got.MacAddress != mac {
					t.Errorf("interface %s: %+v, want MAC %q", iface, got, mac)
				}
			}
			stamp := req.Meta.Annotations[mutators.TransactionTimestampAnnotation]
			if asked := len(c.want) > 0 && c.want[0].AskedOf != ""; asked != (stamp != "") {
				t.Errorf("%s = %q; want it carried exactly when kubemacpool answered", mutators.TransactionTimestampAnnotation, stamp)
			}
			checkMACPoolRecord(t, req, c.want, c.warned)
			if c.warned && !strings.Contains(strings.Join(req.Warnings, "\n"), "kvnet could not call it") {
				t.Errorf("warnings %q do not say kvnet could not call kubemacpool", req.Warnings)
			}
		})
	}
}

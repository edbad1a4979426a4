package mutators

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
)

// macsMissed counts the interfaces kvnet added to VMs that a MAC pool
// registered for them does not see.
var macsMissed = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_vm_interfaces_missed_by_mac_pool_total",
	Help: "Interfaces kvnet added to VirtualMachines that the MAC pool webhook registered for them (kubemacpool) does not see, because the API server calls it before kvnet and not again: they get no MAC from the pool (one per interface and request), by peer.",
}, []string{"peer"})

// macsLeft counts the interfaces kvnet added to VMs and left to a MAC pool
// that sees them.
var macsLeft = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_vm_interfaces_left_to_mac_pool_total",
	Help: "Interfaces kvnet added to VirtualMachines without a MAC and left to the MAC pool webhook registered for them (kubemacpool), which the API server calls after kvnet or again after it (one per interface and request), by peer.",
}, []string{"peer"})

// macsAsked counts kvnet's calls of a MAC pool's webhook, by outcome:
// "answered" (its MACs taken), "refused" (it refused the VM) and "failed"
// (no answer, or one kvnet could not read).
var macsAsked = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_mac_pool_asks_total",
	Help: "Calls kvnet made to a MAC pool's VM webhook (kubemacpool) for the MACs of the interfaces it added, where the API server calls the pool before kvnet and not again, by peer and outcome (answered, refused, failed).",
}, []string{"peer", "outcome"})

// TransactionTimestampAnnotation is where kubemacpool (v0.51.1,
// pkg/pool-manager) keeps the time of the VM's last MAC allocation: its VM
// controller commits the MACs it allocated in that transaction once it
// sees the VM stored with it, and frees them after its --wait-time if it
// never does. kvnet carries the value of the allocation it asked for.
const TransactionTimestampAnnotation = "kubemacpool.io/transaction-timestamp"

// MACPool says what becomes of the MACs of the interfaces kvnet adds to a
// VM where kubemacpool gives VMs their MACs. kvnet chooses none itself: a
// MAC pool's MACs are unique because the pool hands them all out.
//
// Where the pool sees the interfaces (the API server calls it after kvnet,
// or again after kvnet changed the VM, reinvocationPolicy IfNeeded), kvnet
// leaves their MACs to it (kvnet.io/mutations "leftTo",
// kvnet_vm_interfaces_left_to_mac_pool_total, a log line). Where it does not
// (kubemacpool as it ships: its configuration's name sorts before kvnet's
// and its policy is Never), kvnet calls the pool's webhook itself, as the
// API server would have, with the VM as kvnet leaves it, and takes from
// its answer the MACs of kvnet's interfaces and the pool's transaction
// annotation ("askedOf", kvnet_mac_pool_asks_total, a log line). The pool
// records the MACs as the VM's, as it does for a VM it sees. If the call
// fails, the pool's failurePolicy decides: Fail (as shipped) refuses the
// VM as the API server would have, Ignore admits it with the interfaces
// unassigned ("missedBy", an admission warning naming the fix,
// kvnet_vm_interfaces_missed_by_mac_pool_total and a log line), which is
// also what the offline CLI, which calls nothing, says.
//
// It runs after every mutator that adds interfaces, and looks only at the
// interfaces added in this request that still have no macAddress (a MAC
// asked for in kvnet.io/networks is the interface's own: Addresses).
type MACPool struct {
	// Webhooks calls the pool's webhook; nil never calls it.
	Webhooks WebhookCaller
}

// WebhookCaller calls a peer's mutating webhook as the API server does
// (peerwebhook.Client).
type WebhookCaller interface {
	Call(ctx context.Context, hook *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error)
}

// Name implements chain.VMMutator.
func (MACPool) Name() string { return "mac-pool" }

// Mutate implements chain.VMMutator.
func (m MACPool) Mutate(ctx context.Context, req *chain.Request) error {
	if !anyAdded(req) {
		return nil // the common path: nothing added, no lookup
	}
	pool, err := req.Facts.MACPool(ctx, req.Namespace)
	if err != nil || pool.Webhook == "" {
		return err // no pool: the lists below are not built
	}
	var added, bare []string
	for n, iface := range addedInterfaces(req) {
		if added = append(added, n); iface.MacAddress == "" {
			bare = append(bare, n)
		}
	}
	if pool.SeesKvnetInterfaces() {
		if len(bare) > 0 {
			macsLeft.WithLabelValues(peers.Kubemacpool).Add(float64(len(bare)))
			logf.FromContext(ctx).Info("leaving the MACs of the interfaces kvnet added to kubemacpool, which the API server calls after kvnet",
				"namespace", req.Namespace, "name", req.Name, "webhook", pool.Webhook, "networks", bare)
			req.RecordLeftTo(m.Name(), peers.Kubemacpool, bare...)
		}
		return nil
	}
	asked := m.Webhooks != nil && pool.Hook != nil && req.Kind == chain.KindVM && req.Review != nil
	if asked {
		if bare, err = m.ask(ctx, req, pool, added, bare); err != nil {
			return err
		}
	}
	if len(bare) == 0 {
		return nil
	}
	macsMissed.WithLabelValues(peers.Kubemacpool).Add(float64(len(bare)))
	logf.FromContext(ctx).Info("kubemacpool does not see the interfaces kvnet added: they get no MAC from its pool",
		"namespace", req.Namespace, "name", req.Name, "webhook", pool.Webhook, "networks", bare)
	why := "its webhook %s runs before kvnet's and is not called again"
	if asked {
		why += ", and kvnet could not call it (its log says why)"
	}
	req.Warn("interfaces %v get no MAC from kubemacpool: "+why+"; set its reinvocationPolicy to IfNeeded (docs/peers.md, kubemacpool)", bare, pool.Webhook)
	req.RecordMissedBy(m.Name(), peers.Kubemacpool, bare...)
	return nil
}

// addedInterfaces yields each network the network injector added that has
// an interface, with the interface.
func addedInterfaces(req *chain.Request) iter.Seq2[string, *kubevirtv1.Interface] {
	return func(yield func(string, *kubevirtv1.Interface) bool) {
		for _, c := range req.Changes {
			if c.Mutator != (NetworkInjector{}).Name() {
				continue
			}
			for _, n := range c.Networks {
				if _, iface := req.Interface(n); iface != nil && !yield(n, iface) {
					return
				}
			}
		}
	}
}

// anyAdded reports whether the network injector added an interface.
func anyAdded(req *chain.Request) bool {
	for range addedInterfaces(req) {
		return true
	}
	return false
}

// ask calls the pool's webhook with the VM as kvnet leaves it, so that the
// pool records the MACs of the interfaces kvnet added (those kvnet set
// too: a MAC asked for in kvnet.io/networks) and gives one to those in
// bare, which have none. It returns the interfaces of bare still without
// one: all of them where the call failed and the pool's failurePolicy is
// Ignore. Its error is the VM's refusal: the pool refused, or failed with
// failurePolicy Fail, as the API server would have had it.
func (m MACPool) ask(ctx context.Context, req *chain.Request, pool peers.MACPool, added, bare []string) ([]string, error) {
	log := logf.FromContext(ctx).WithValues("namespace", req.Namespace, "name", req.Name, "webhook", pool.Webhook)
	resp, err := m.call(ctx, req, pool)
	if err == nil && resp.Allowed {
		err = applyMACPatch(req, resp)
	}
	switch {
	case err == nil && resp.Allowed:
		macsAsked.WithLabelValues(peers.Kubemacpool, "answered").Inc()
		bare = slices.DeleteFunc(bare, func(n string) bool { _, iface := req.Interface(n); return iface.MacAddress != "" })
		asked := slices.DeleteFunc(added, func(n string) bool { return slices.Contains(bare, n) })
		if len(asked) > 0 {
			req.RecordAskedOf(m.Name(), peers.Kubemacpool, asked...)
			log.Info("asked kubemacpool for the MACs of the interfaces kvnet added, which it does not see", "networks", asked)
		}
		return bare, nil
	case err == nil:
		macsAsked.WithLabelValues(peers.Kubemacpool, "refused").Inc()
		return nil, refusedBy(pool.Webhook, resp.Result)
	}
	macsAsked.WithLabelValues(peers.Kubemacpool, "failed").Inc()
	if pool.FailsClosed() {
		return nil, fmt.Errorf("asking kubemacpool (%s, failurePolicy Fail) for the MACs of interfaces %v: %w", pool.Webhook, added, err)
	}
	log.Error(err, "asking kubemacpool for the MACs of the interfaces kvnet added failed; its failurePolicy is Ignore", "networks", added)
	return bare, nil
}

// call sends the pool the admission request the API server sent kvnet,
// its object the VM as kvnet leaves it, reduced to what kubemacpool reads
// of it (v0.51.1, pkg/webhook/virtualmachine and pkg/pool-manager): the
// name, namespace, labels and annotations, and the template with its
// interfaces and networks.
func (m MACPool) call(ctx context.Context, req *chain.Request, pool peers.MACPool) (*admissionv1.AdmissionResponse, error) {
	vm := kubevirtv1.VirtualMachine{
		TypeMeta: metav1.TypeMeta{APIVersion: kubevirtv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{
			Name: req.Name, Namespace: req.Namespace, Labels: req.Meta.Labels, Annotations: req.Meta.Annotations,
		},
		Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: *req.TemplateMeta, Spec: *req.Spec,
		}},
	}
	raw, err := json.Marshal(&vm)
	if err != nil {
		return nil, fmt.Errorf("encoding the VM for kubemacpool: %w", err)
	}
	ar := *req.Review
	ar.Object = runtime.RawExtension{Raw: raw}
	return m.Webhooks.Call(ctx, pool.Hook, &ar)
}

// interfacesPath and macSuffix match what kubemacpool patches on a VM: an
// interface's macAddress, by index.
const (
	interfacesPath = "/spec/template/spec/domain/devices/interfaces/"
	macSuffix      = "/macAddress"
)

// applyMACPatch takes from the pool's JSON patch the MACs it gave
// interfaces that have none and its transaction annotation, and nothing
// else: the pool is asked for MACs, not trusted with the rest of the VM.
// A patch it cannot read changes nothing.
func applyMACPatch(req *chain.Request, resp *admissionv1.AdmissionResponse) error {
	if len(resp.Patch) == 0 {
		return nil
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		return fmt.Errorf("kubemacpool answered a patch of type %v, want JSONPatch", resp.PatchType)
	}
	var ops []struct {
		Op    string          `json:"op"`
		Path  string          `json:"path"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(resp.Patch, &ops); err != nil {
		return fmt.Errorf("decoding kubemacpool's patch: %w", err)
	}
	// Read the whole patch before changing anything: a patch refused
	// halfway leaves the VM as it was.
	ifaces := req.Spec.Domain.Devices.Interfaces
	macs := map[int]string{}
	timestamp, stamped := "", false
	for _, op := range ops {
		if op.Op != "add" && op.Op != "replace" {
			continue
		}
		var value string
		switch {
		case op.Path == "/metadata/annotations/"+strings.ReplaceAll(TransactionTimestampAnnotation, "/", "~1"):
			if err := json.Unmarshal(op.Value, &timestamp); err != nil {
				return fmt.Errorf("kubemacpool's %s: %w", TransactionTimestampAnnotation, err)
			}
			stamped = true
		case strings.HasPrefix(op.Path, interfacesPath) && strings.HasSuffix(op.Path, macSuffix):
			i, err := strconv.Atoi(op.Path[len(interfacesPath) : len(op.Path)-len(macSuffix)])
			if err != nil || i < 0 || i >= len(ifaces) {
				return fmt.Errorf("kubemacpool patched %s, which is no interface of the VM", op.Path)
			}
			if err := json.Unmarshal(op.Value, &value); err != nil {
				return fmt.Errorf("kubemacpool's %s: %w", op.Path, err)
			}
			if _, err := net.ParseMAC(value); err != nil {
				return fmt.Errorf("kubemacpool's %s: %w", op.Path, err)
			}
			macs[i] = value
		}
	}
	for i, mac := range macs {
		if ifaces[i].MacAddress == "" {
			ifaces[i].MacAddress = mac
		}
	}
	if stamped {
		if req.Meta.Annotations == nil {
			req.Meta.Annotations = map[string]string{}
		}
		req.Meta.Annotations[TransactionTimestampAnnotation] = timestamp
	}
	return nil
}

// refusedBy is the pool's refusal of the VM, as the API server would have
// returned it: its own 4xx as the user's, anything else as a failure.
func refusedBy(webhook string, result *metav1.Status) error {
	msg, code := "", int32(http.StatusInternalServerError)
	if result != nil {
		msg, code = result.Message, result.Code
	}
	if code >= 400 && code < 500 {
		return chain.Refuse(&apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: code, Reason: result.Reason,
			Message: fmt.Sprintf("admission webhook %q denied the request: %s", webhook, msg),
		}})
	}
	return fmt.Errorf("kubemacpool (%s) refused the VM's MACs: HTTP %d: %s", webhook, code, msg)
}

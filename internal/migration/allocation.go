// Package migration gives KubeVirt's migration pods static addresses on
// Multus networks without DHCP: every virt-handler its own address on the
// in-cluster migration network (the same one whenever it returns to a node),
// and the synchronization controllers one of a few cross-cluster addresses.
//
// # State
//
// Every address in use is one ConfigMap in kvnet's namespace, named after the
// pool and the address (kvnet-mig-ic-10-10-0-5). Taking a free address is a
// Create of that name, which the API server grants to exactly one caller;
// taking over an allocation whose pod is gone is an Update at the
// resourceVersion that was inspected, which fails for everyone but the first
// writer; releasing is an Update or a Delete with the same precondition. So
// two kvnet replicas, or a replica and the controller, can race freely: the
// loser gets AlreadyExists or Conflict and looks again.
//
// An allocation is reserved (handed out at admission, the pod does not exist
// yet: mutating admission runs before generateName is resolved), bound (the
// controller saw the pod with the reservation token and recorded its name and
// UID) or idle (in-cluster only: the node's virt-handler is gone, the address
// waits for it to come back).
package migration

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pool identifiers: fixed, so that an allocation outlives config edits.
const (
	PoolInCluster    = "in-cluster"
	PoolCrossCluster = "cross-cluster"
)

// Labels, annotations and data keys of kvnet's migration objects.
const (
	// LabelPool marks allocation ConfigMaps and names their pool.
	LabelPool = "kvnet.io/migration-pool"
	// LabelReservation goes on every pod kvnet gave an address: its value is
	// the token of the admission that reserved the pod's allocations, so the
	// controller can find the pod that carries a reservation.
	LabelReservation = "kvnet.io/migration-reservation"

	keyAddress      = "address"
	keyPrefixLength = "prefixLength"
	keyState        = "state"
	keyNode         = "node"
	keyReservation  = "reservation"
	keyReservedAt   = "reservedAt"
	keyPodNamespace = "podNamespace"
	keyPodName      = "podName"
	keyPodUID       = "podUID"
)

// State of an allocation.
type State string

// States; see the package doc.
const (
	StateReserved State = "reserved"
	StateBound    State = "bound"
	StateIdle     State = "idle"
)

// Allocation is one address held in one pool. It is stored as a ConfigMap;
// CM is the object it was read from (nil for a new one), whose
// resourceVersion guards every write.
type Allocation struct {
	Pool         string
	Address      netip.Addr
	PrefixLength int
	State        State
	// Node is set for in-cluster allocations of pods bound to a node
	// (virt-handler): the address returns to that node.
	Node string
	// Reservation is the token of the admission that handed it out; the pod
	// carries it in LabelReservation.
	Reservation  string
	ReservedAt   time.Time
	PodNamespace string
	PodName      string
	PodUID       types.UID

	CM *corev1.ConfigMap
}

// ObjectName is the ConfigMap name of an address in a pool. IPv6 addresses
// are written out in full so that every address has exactly one name.
func ObjectName(pool string, a netip.Addr) string {
	short := "ic"
	if pool == PoolCrossCluster {
		short = "cc"
	}
	s := a.String()
	if a.Is6() {
		s = a.StringExpanded()
	}
	return "kvnet-mig-" + short + "-" + nameReplacer.Replace(s)
}

var nameReplacer = strings.NewReplacer(".", "-", ":", "-")

// ParseObjectName inverts ObjectName: the pool and address an allocation
// object name stands for.
func ParseObjectName(name string) (pool string, a netip.Addr, ok bool) {
	rest, found := strings.CutPrefix(name, "kvnet-mig-")
	if !found || len(rest) < 3 {
		return "", netip.Addr{}, false
	}
	switch rest[:3] {
	case "ic-":
		pool = PoolInCluster
	case "cc-":
		pool = PoolCrossCluster
	default:
		return "", netip.Addr{}, false
	}
	parts := strings.Split(rest[3:], "-")
	var s string
	switch len(parts) {
	case 4:
		s = strings.Join(parts, ".")
	case 8:
		s = strings.Join(parts, ":")
	default:
		return "", netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || ObjectName(pool, a) != name {
		return "", netip.Addr{}, false
	}
	return pool, a, true
}

// CIDR is the address with its prefix length, as Multus wants it.
func (a *Allocation) CIDR() string {
	return netip.PrefixFrom(a.Address, a.PrefixLength).String()
}

// Name is the ConfigMap name.
func (a *Allocation) Name() string { return ObjectName(a.Pool, a.Address) }

// ToConfigMap writes a onto cm (a new object when cm is nil), keeping the
// object's metadata so an Update carries its resourceVersion.
func (a *Allocation) ToConfigMap(namespace string) *corev1.ConfigMap {
	var cm *corev1.ConfigMap
	if a.CM != nil {
		cm = a.CM.DeepCopy()
	} else {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: a.Name()}}
	}
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels[LabelPool] = a.Pool
	cm.Labels["app.kubernetes.io/managed-by"] = "kvnet"
	cm.Data = map[string]string{
		keyAddress:      a.Address.String(),
		keyPrefixLength: strconv.Itoa(a.PrefixLength),
		keyState:        string(a.State),
	}
	set := func(k, v string) {
		if v != "" {
			cm.Data[k] = v
		}
	}
	set(keyNode, a.Node)
	set(keyReservation, a.Reservation)
	if !a.ReservedAt.IsZero() {
		cm.Data[keyReservedAt] = a.ReservedAt.UTC().Format(time.RFC3339Nano)
	}
	set(keyPodNamespace, a.PodNamespace)
	set(keyPodName, a.PodName)
	set(keyPodUID, string(a.PodUID))
	return cm
}

// FromConfigMap reads an allocation. A ConfigMap that does not parse was not
// written by kvnet (or was edited by hand); the error says what is wrong.
func FromConfigMap(cm *corev1.ConfigMap) (*Allocation, error) {
	d := cm.Data
	addr, err := netip.ParseAddr(d[keyAddress])
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: data.%s %q is not an address", cm.Namespace, cm.Name, keyAddress, d[keyAddress])
	}
	bits, err := strconv.Atoi(d[keyPrefixLength])
	if err != nil || bits < 0 || bits > addr.BitLen() {
		return nil, fmt.Errorf("ConfigMap %s/%s: data.%s %q is not a prefix length", cm.Namespace, cm.Name, keyPrefixLength, d[keyPrefixLength])
	}
	a := &Allocation{
		Pool: cm.Labels[LabelPool], Address: addr, PrefixLength: bits, State: State(d[keyState]),
		Node: d[keyNode], Reservation: d[keyReservation],
		PodNamespace: d[keyPodNamespace], PodName: d[keyPodName], PodUID: types.UID(d[keyPodUID]),
		CM: cm,
	}
	switch a.State {
	case StateReserved, StateBound, StateIdle:
	default:
		return nil, fmt.Errorf("ConfigMap %s/%s: data.%s %q is not reserved, bound or idle", cm.Namespace, cm.Name, keyState, d[keyState])
	}
	if s := d[keyReservedAt]; s != "" {
		if a.ReservedAt, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s: data.%s %q is not a time", cm.Namespace, cm.Name, keyReservedAt, s)
		}
	}
	if a.Name() != cm.Name {
		return nil, fmt.Errorf("ConfigMap %s/%s: holds %s of pool %q, whose object is %s", cm.Namespace, cm.Name, addr, a.Pool, a.Name())
	}
	return a, nil
}

// Holder describes who holds the allocation, for tables and messages.
func (a *Allocation) Holder() string {
	switch a.State {
	case StateBound:
		return a.PodNamespace + "/" + a.PodName
	case StateReserved:
		return "reservation " + a.Reservation + " in " + a.PodNamespace
	}
	return "-"
}

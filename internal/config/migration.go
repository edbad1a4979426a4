package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/model/ippool"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// Migration defaults. virt-handler looks for its migration address on
// migration0; crosscluster0 is the name VEP 191 proposes for the proxies.
const (
	DefaultMigrationInterface    = "migration0"
	DefaultCrossClusterInterface = "crosscluster0"
	DefaultReservationTimeout    = 2 * time.Minute

	// KubeVirt's ServiceAccounts (virt-operator's names) for the pods that
	// hold migration addresses.
	DefaultHandlerServiceAccount = "kubevirt-handler"
	DefaultSyncServiceAccount    = "kubevirt-synchronization-controller"
)

// Default selectors: the labels KubeVirt puts on its pods.
var (
	DefaultInClusterSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubevirt.io": "virt-handler"}}
	// DefaultCrossClusterSelector: the synchronization controllers and
	// kvnet's migration proxy pods (label kubevirt.io=kvnet-migration-proxy)
	// hold the cross-cluster addresses; virt-handlers never do.
	DefaultCrossClusterSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: "kubevirt.io", Operator: metav1.LabelSelectorOpIn, Values: []string{"virt-synchronization-controller", "kvnet-migration-proxy"},
	}}}
)

func defaultMigration(m Migration) Migration {
	if ic := m.InCluster; ic != nil {
		c := *ic
		if c.Interface == "" {
			c.Interface = DefaultMigrationInterface
		}
		if c.PodSelector == nil {
			c.PodSelector = DefaultInClusterSelector
		}
		if c.Holders == nil {
			c.Holders = []Holder{{ServiceAccount: DefaultHandlerServiceAccount}}
		}
		c.pool = c.AddressPool()
		m.InCluster = &c
	}
	if cc := m.CrossCluster; cc != nil {
		c := *cc
		if c.Interface == "" {
			c.Interface = DefaultCrossClusterInterface
		}
		if c.PodSelector == nil {
			c.PodSelector = DefaultCrossClusterSelector
		}
		if c.Holders == nil {
			c.Holders = []Holder{{ServiceAccount: DefaultSyncServiceAccount}}
		}
		c.pool = c.AddressPool()
		m.CrossCluster = &c
	}
	if m.ReservationTimeout == nil {
		m.ReservationTimeout = &metav1.Duration{Duration: DefaultReservationTimeout}
	}
	if ps := m.ProxySidecar; ps != nil && ps.PodSelector == nil {
		c := *ps
		c.PodSelector = DefaultProxySidecarSelector
		m.ProxySidecar = &c
	}
	return m
}

// DefaultProxySidecarSelector: the migration proxy goes into the pods of
// virt-operator's virt-synchronization-controller Deployment.
var DefaultProxySidecarSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubevirt.io": "virt-synchronization-controller"}}

// Sidecar returns the proxy sidecar a pod with these labels gets, nil when
// none: the injection is on, and the pod is one it selects and a
// cross-cluster holder (the sidecar hops on the pod's crosscluster0).
func (m *Migration) Sidecar(podLabels map[string]string) *ProxySidecar {
	ps := m.ProxySidecar
	if ps == nil || !ps.Enabled || m.CrossCluster == nil || m.InCluster == nil {
		return nil
	}
	if !selects(ps.PodSelector, DefaultProxySidecarSelector, podLabels) || !m.CrossCluster.Selects(podLabels) {
		return nil
	}
	return ps
}

// Enabled reports whether any migration network is configured.
func (m *Migration) Enabled() bool { return m.InCluster != nil || m.CrossCluster != nil }

// Timeout is ReservationTimeout with its default.
func (m *Migration) Timeout() time.Duration {
	if m.ReservationTimeout == nil || m.ReservationTimeout.Duration <= 0 {
		return DefaultReservationTimeout
	}
	return m.ReservationTimeout.Duration
}

// Selects reports whether the in-cluster network applies to a pod with these labels.
func (ic *InClusterMigration) Selects(podLabels map[string]string) bool {
	return selects(ic.PodSelector, DefaultInClusterSelector, podLabels)
}

// Selects reports whether a pod with these labels is a cross-cluster holder.
func (cc *CrossClusterMigration) Selects(podLabels map[string]string) bool {
	return selects(cc.PodSelector, DefaultCrossClusterSelector, podLabels)
}

// Admits reports whether a pod in namespace ns running as ServiceAccount sa
// may hold in-cluster addresses; kubevirtNS is KubeVirt's namespace (see
// Migration.Namespace). When it may not, reason says why, for metrics.
// Parse has put the default holders in.
func (ic *InClusterMigration) Admits(ns, sa, kubevirtNS string) (ok bool, reason string) {
	return admits(ic.Holders, ns, sa, kubevirtNS)
}

// Admits is InClusterMigration.Admits for the cross-cluster holders.
func (cc *CrossClusterMigration) Admits(ns, sa, kubevirtNS string) (ok bool, reason string) {
	return admits(cc.Holders, ns, sa, kubevirtNS)
}

// Reasons a pod that claims by its labels to hold migration addresses is
// not given any.
const (
	NotHolderNamespace      = "namespace"
	NotHolderServiceAccount = "service-account"
	NoKubeVirtNamespace     = "no-kubevirt-namespace"
)

// namespaceOf is the namespace of h's pods: its own, else KubeVirt's
// (kubevirtNS); "" when neither is known.
func (h Holder) namespaceOf(kubevirtNS string) string {
	if h.Namespace != "" {
		return h.Namespace
	}
	return kubevirtNS
}

func admits(holders []Holder, ns, sa, kubevirtNS string) (bool, string) {
	reason := NoKubeVirtNamespace
	for _, h := range holders {
		hns := h.namespaceOf(kubevirtNS)
		switch {
		case hns == "":
			continue
		case hns != ns:
			if reason == NoKubeVirtNamespace {
				reason = NotHolderNamespace
			}
		case h.ServiceAccount == sa:
			return true, ""
		default:
			reason = NotHolderServiceAccount
		}
	}
	return false, reason
}

// HolderNamespaces lists the namespaces migration pods may live in, for
// the migration-pods webhook's namespaceSelector; nil when one of them is
// KubeVirt's and migration.namespace leaves it to the KubeVirt CR, which
// only admission knows.
func (m *Migration) HolderNamespaces() []string {
	var holders []Holder
	if ic := m.InCluster; ic != nil {
		holders = append(holders, ic.Holders...)
	}
	if cc := m.CrossCluster; cc != nil {
		holders = append(holders, cc.Holders...)
	}
	var out []string
	for _, h := range holders {
		ns := h.namespaceOf(m.Namespace)
		if ns == "" {
			return nil
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// AddressPool is the in-cluster pool, parsed once when the config loaded
// (Default): read-only, shared by every admission. Validate refuses a pool
// that does not parse, so a loaded config always has one. A config built
// in code without Default gets it parsed here or, when it does not parse,
// an empty pool: every pod is then refused as from an exhausted pool
// rather than answered with a 500.
func (ic *InClusterMigration) AddressPool() *ippool.Pool {
	if ic.pool != nil {
		return ic.pool
	}
	return orEmpty(ippool.New(ic.Pool.CIDR, ic.Pool.Ranges, ic.Pool.Exclude))
}

// AddressPool is the cross-cluster list, parsed as InClusterMigration's is.
func (cc *CrossClusterMigration) AddressPool() *ippool.Pool {
	if cc.pool != nil {
		return cc.pool
	}
	return orEmpty(ippool.FromList(cc.Addresses))
}

func orEmpty(p *ippool.Pool, err error) *ippool.Pool {
	if err != nil {
		p, _ = ippool.FromList(nil)
	}
	return p
}

func selects(s, def *metav1.LabelSelector, set map[string]string) bool {
	if s == nil {
		s = def
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return false // Validate rejects such selectors.
	}
	return sel.Matches(labels.Set(set))
}

// validateMigration checks the migration section on its own; the checks that
// need the cluster (NADs exist, holder replicas) are in package migration.
func validateMigration(m *Migration, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	var icPool, ccPool *ippool.Pool
	if m.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(m.Namespace) {
			errs = append(errs, field.Invalid(p.Child("namespace"), m.Namespace, msg))
		}
	}
	if ic := m.InCluster; ic != nil {
		ip := p.Child("inCluster")
		errs = append(errs, validateHolders(ic.Holders, ip.Child("holders"))...)
		errs = append(errs, validateMigrationNAD(ic.NAD, ip.Child("nad"))...)
		errs = append(errs, validateIfName(ic.Interface, ip.Child("interface"))...)
		errs = append(errs, validateSelector(ic.PodSelector, ip.Child("podSelector"))...)
		pp := ip.Child("pool")
		if ic.Pool.CIDR == "" {
			errs = append(errs, field.Required(pp.Child("cidr"), "the subnet the addresses come from"))
		} else if pool, err := ippool.New(ic.Pool.CIDR, ic.Pool.Ranges, ic.Pool.Exclude); err != nil {
			errs = append(errs, poolError(pp, err))
		} else if pool.Size().Sign() == 0 {
			errs = append(errs, field.Invalid(pp, ic.Pool.CIDR, "the ranges minus the exclusions leave no address"))
		} else {
			icPool = pool
		}
	}
	if cc := m.CrossCluster; cc != nil {
		cp := p.Child("crossCluster")
		errs = append(errs, validateHolders(cc.Holders, cp.Child("holders"))...)
		errs = append(errs, validateMigrationNAD(cc.NAD, cp.Child("nad"))...)
		errs = append(errs, validateIfName(cc.Interface, cp.Child("interface"))...)
		errs = append(errs, validateSelector(cc.PodSelector, cp.Child("podSelector"))...)
		if len(cc.Addresses) == 0 {
			errs = append(errs, field.Required(cp.Child("addresses"), "the addresses the cross-cluster holders share"))
		} else if pool, err := ippool.FromList(cc.Addresses); err != nil {
			errs = append(errs, poolError(cp, err))
		} else {
			ccPool = pool
		}
		if cc.AlsoInCluster && m.InCluster == nil {
			errs = append(errs, field.Invalid(cp.Child("alsoInCluster"), true, "needs migration.inCluster"))
		}
		if ic := m.InCluster; ic != nil && ic.NAD == cc.NAD && ifName(ic.Interface, DefaultMigrationInterface) == ifName(cc.Interface, DefaultCrossClusterInterface) {
			errs = append(errs, field.Invalid(cp.Child("interface"), cc.Interface, "the in-cluster network uses the same NAD and interface"))
		}
	}
	if icPool != nil && ccPool != nil {
		if a, ok := icPool.Overlaps(ccPool); ok {
			errs = append(errs, field.Invalid(p.Child("crossCluster", "addresses"), a.String(), fmt.Sprintf("is also in the in-cluster pool %s; the pools must not overlap", icPool)))
		}
	}
	if ps := m.ProxySidecar; ps != nil {
		errs = append(errs, validateProxySidecar(m, ps, p.Child("proxySidecar"))...)
	}
	if t := m.ReservationTimeout; t != nil && t.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("reservationTimeout"), t.Duration.String(), "must be positive; keep it above the API server's request timeout (60s)"))
	}
	return errs
}

// validateProxySidecar checks the injected container, when the injection
// is on, enough that a pod never fails its own validation because of it: a
// name, an image, and mounts of volumes that come with it.
func validateProxySidecar(m *Migration, ps *ProxySidecar, p *field.Path) field.ErrorList {
	errs := validateSelector(ps.PodSelector, p.Child("podSelector"))
	if !ps.Enabled {
		return errs // the off switch: the rest may be left out
	}
	if m.CrossCluster == nil || m.InCluster == nil {
		errs = append(errs, field.Invalid(p.Child("enabled"), true, "needs migration.inCluster and migration.crossCluster: the sidecar listens on the pod's migration0 and hops on its crosscluster0"))
	}
	cp := p.Child("container")
	if ps.Container.Name == "" {
		errs = append(errs, field.Required(cp.Child("name"), "the name the sidecar container gets"))
	} else if msgs := validation.IsDNS1123Label(ps.Container.Name); len(msgs) > 0 {
		errs = append(errs, field.Invalid(cp.Child("name"), ps.Container.Name, strings.Join(msgs, "; ")))
	}
	if ps.Container.Image == "" {
		errs = append(errs, field.Required(cp.Child("image"), "the kvnet image"))
	}
	vols := map[string]bool{}
	for i, v := range ps.Volumes {
		vp := p.Child("volumes").Index(i).Child("name")
		switch {
		case v.Name == "":
			errs = append(errs, field.Required(vp, ""))
		case vols[v.Name]:
			errs = append(errs, field.Duplicate(vp, v.Name))
		}
		vols[v.Name] = true
	}
	for i, vm := range ps.Container.VolumeMounts {
		if !vols[vm.Name] {
			errs = append(errs, field.NotFound(cp.Child("volumeMounts").Index(i).Child("name"), vm.Name))
		}
	}
	return errs
}

// validateHolders checks each holder's names; an empty list (not nil)
// would give nobody an address, which is a config mistake, not a policy.
func validateHolders(hs []Holder, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if hs != nil && len(hs) == 0 {
		errs = append(errs, field.Required(p, "at least one holder (namespace and serviceAccount), or leave holders out for KubeVirt's"))
	}
	for i, h := range hs {
		hp := p.Index(i)
		if h.Namespace != "" {
			for _, msg := range validation.IsDNS1123Label(h.Namespace) {
				errs = append(errs, field.Invalid(hp.Child("namespace"), h.Namespace, msg))
			}
		}
		if h.ServiceAccount == "" {
			errs = append(errs, field.Required(hp.Child("serviceAccount"), "the pods' spec.serviceAccountName"))
		} else {
			for _, msg := range validation.IsDNS1123Subdomain(h.ServiceAccount) {
				errs = append(errs, field.Invalid(hp.Child("serviceAccount"), h.ServiceAccount, msg))
			}
		}
	}
	return errs
}

func ifName(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func validateMigrationNAD(nad netattach.Ref, p *field.Path) field.ErrorList {
	switch {
	case nad.IsZero():
		return field.ErrorList{field.Required(p, `the NetworkAttachmentDefinition, "namespace/name"`)}
	case !strings.Contains(nad.String(), "/"):
		return field.ErrorList{field.Invalid(p, nad.String(), `want "namespace/name": name the namespace of the NAD (normally KubeVirt's)`)}
	case nad.Err() != nil:
		return field.ErrorList{field.Invalid(p, nad.String(), nad.Err().Error())}
	}
	return nil
}

// validateIfName checks a Linux interface name: at most 15 bytes, no '/',
// ':' or whitespace.
func validateIfName(s string, p *field.Path) field.ErrorList {
	if s == "" {
		return nil
	}
	if len(s) > 15 {
		return field.ErrorList{field.TooLong(p, s, 15)}
	}
	for _, r := range s {
		if r == '/' || r == ':' || r <= ' ' || r > '~' {
			return field.ErrorList{field.Invalid(p, s, "not a Linux interface name")}
		}
	}
	return nil
}

func poolError(p *field.Path, err error) *field.Error {
	if fe, ok := err.(*ippool.FieldError); ok {
		fp := p.Child(fe.Field)
		if fe.Index >= 0 {
			fp = fp.Index(fe.Index)
		}
		return field.Invalid(fp, fe.Value, fe.Msg)
	}
	return field.Invalid(p, "", err.Error())
}

package persistentips

import (
	"context"
	"fmt"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/owner"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
)

// KubeVirt's launcher-pod metadata (which VMI a pod runs), the cache
// indexes, and the controller's event reasons and delays.
const (
	launcherValue       = "virt-launcher"
	ownerIndex          = "kvnet.io/ipamclaim-controller"
	nadIndex            = "kvnet.io/nads"
	waitForGC           = 10 * time.Second
	waitForLauncher     = 30 * time.Second
	eventReasonClaim    = "IPAMClaimCreated"
	eventReasonConflict = "IPAMClaimConflict"
	eventReasonReplaced = "IPAMClaimRecreated"
)

// Reconciler keeps the IPAMClaims of one VM (or standalone VMI), keyed by
// namespace/name: VMs and the VMIs they start share the name, so one key
// covers the VM, its VMI, their launcher pods and their claims.
type Reconciler struct {
	// Client writes claims; its reads come from the manager's cache.
	Client client.Client
	// Pods lists virt-launcher pods (a cache restricted to them).
	Pods client.Reader
	// Facts resolves NADs from the cache, as admission does.
	Facts  lookup.Facts
	Config *config.Source
	// Events records conflicts on the VM; nil records nothing.
	Events events.EventRecorder

	leaks leakTracker
}

// SetupWithManager registers the controller (leader-elected, as every
// controller-runtime controller is by default), the claim owner index, and a
// cache of virt-launcher pods only, so releasing a standalone VMI's claims can
// wait for its pod without kvnet caching every pod of the cluster.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr manager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &ipamv1alpha1.IPAMClaim{}, ownerIndex, func(o client.Object) []string {
		if ref := owner.ControllingKubeVirt(o); ref != nil {
			return []string{ref.Kind + "/" + ref.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing IPAMClaims by owner: %w", err)
	}
	for _, obj := range []client.Object{&kubevirtv1.VirtualMachine{}, &kubevirtv1.VirtualMachineInstance{}} {
		if err := mgr.GetFieldIndexer().IndexField(ctx, obj, nadIndex, nadRefs); err != nil {
			return fmt.Errorf("indexing %T by NAD: %w", obj, err)
		}
	}
	pods, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(),
		Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{kubevirtv1.AppLabel: launcherValue})},
		},
		// Only labels, the domain annotation (launcherVMI) and the phase
		// (launcherActive) are read: drop the rest before caching. A launcher
		// pod's spec and its other annotations are most of its bytes.
		DefaultTransform: func(in any) (any, error) {
			if p, ok := in.(*corev1.Pod); ok {
				p.Spec = corev1.PodSpec{}
				p.Status = corev1.PodStatus{Phase: p.Status.Phase}
				p.ManagedFields = nil
				p.Annotations = keepDomainAnnotation(p.Annotations)
			}
			return in, nil
		},
	})
	if err != nil {
		return fmt.Errorf("creating the launcher-pod cache: %w", err)
	}
	if err := mgr.Add(pods); err != nil {
		return err
	}
	r.Pods = pods
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("persistentips").
		For(&kubevirtv1.VirtualMachine{}).
		Watches(&kubevirtv1.VirtualMachineInstance{}, &handler.EnqueueRequestForObject{}).
		Watches(&ipamv1alpha1.IPAMClaim{}, handler.EnqueueRequestsFromMapFunc(claimOwner)).
		Watches(&nadv1.NetworkAttachmentDefinition{}, handler.EnqueueRequestsFromMapFunc(r.usersOfNAD)).
		WatchesRawSource(source.Kind(pods, &corev1.Pod{}, handler.TypedEnqueueRequestsFromMapFunc(launcherVMI))).
		Complete(r)
}

// keepDomainAnnotation is a launcher pod's annotations reduced to the
// VMI's name (kubevirt.io/domain).
func keepDomainAnnotation(a map[string]string) map[string]string {
	name, ok := a[kubevirtv1.DomainAnnotation]
	if !ok {
		return nil
	}
	return map[string]string{kubevirtv1.DomainAnnotation: name}
}

func claimOwner(_ context.Context, o client.Object) []reconcile.Request {
	if ref := owner.ControllingKubeVirt(o); ref != nil {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}}
	}
	return nil
}

func launcherVMI(_ context.Context, p *corev1.Pod) []reconcile.Request {
	if name := p.Annotations[kubevirtv1.DomainAnnotation]; name != "" {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: name}}}
	}
	return nil
}

// podNetworkRef is the nadIndex key of a namespace's VMs and VMIs that have
// a pod network: the users of the namespace's primary user-defined network.
// "*" cannot start a NAD name, so it collides with no NAD.
func podNetworkRef(namespace string) string { return namespace + "/*pod-network" }

// nadRefs indexes VMs and VMIs by the NADs ("ns/name") their Multus
// networks attach, and by podNetworkRef when they have a pod network.
func nadRefs(o client.Object) []string {
	var spec *kubevirtv1.VirtualMachineInstanceSpec
	switch v := o.(type) {
	case *kubevirtv1.VirtualMachine:
		if v.Spec.Template != nil {
			spec = &v.Spec.Template.Spec
		}
	case *kubevirtv1.VirtualMachineInstance:
		spec = &v.Spec
	}
	if spec == nil {
		return nil
	}
	var out []string
	for _, n := range spec.Networks {
		if n.Multus == nil {
			continue
		}
		if ref, err := netattach.ParseRefIn(n.Multus.NetworkName, o.GetNamespace()); err == nil {
			out = append(out, ref.String())
		}
	}
	if primaryudn.PodNetwork(spec) != nil {
		out = append(out, podNetworkRef(o.GetNamespace()))
	}
	return out
}

// usersOfNAD enqueues every VM and VMI that attaches a NAD, so a VM created
// before its NAD (or before the NAD allowed persistent IPs) gets its claim
// when the NAD arrives; for a primary user-defined network, every VM and
// VMI of its namespace with a pod network. An index keeps this a lookup,
// not a scan of every VM.
func (r *Reconciler) usersOfNAD(ctx context.Context, o client.Object) []reconcile.Request {
	keys := []string{o.GetNamespace() + "/" + o.GetName()}
	if nad, ok := o.(*nadv1.NetworkAttachmentDefinition); ok && netattach.Parse(nad).IsPrimaryUDN() {
		keys = append(keys, podNetworkRef(o.GetNamespace()))
	}
	var out []reconcile.Request
	for _, k := range keys {
		key := client.MatchingFields{nadIndex: k}
		var vms kubevirtv1.VirtualMachineList
		if err := r.Client.List(ctx, &vms, key); err != nil {
			logf.FromContext(ctx).Error(err, "listing VMs that attach a NAD", "nad", k)
		}
		for _, vm := range vms.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vm.Namespace, Name: vm.Name}})
		}
		var vmis kubevirtv1.VirtualMachineInstanceList
		if err := r.Client.List(ctx, &vmis, key); err != nil {
			logf.FromContext(ctx).Error(err, "listing VMIs that attach a NAD", "nad", k)
		}
		for _, vmi := range vmis.Items {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}})
		}
	}
	return out
}

// Reconcile first releases claims whose owner is going or gone, then ensures
// the claims the live owner needs. Releasing runs even when the feature is
// turned off, so that turning it off never leaves claims stuck on a
// finalizer nobody removes.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	vm := &kubevirtv1.VirtualMachine{}
	if err := r.Client.Get(ctx, req.NamespacedName, vm); apierrors.IsNotFound(err) {
		vm = nil
	} else if err != nil {
		return reconcile.Result{}, fmt.Errorf("reading VirtualMachine %s: %w", req, err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	if err := r.Client.Get(ctx, req.NamespacedName, vmi); apierrors.IsNotFound(err) {
		vmi = nil
	} else if err != nil {
		return reconcile.Result{}, fmt.Errorf("reading VirtualMachineInstance %s: %w", req, err)
	}
	var result reconcile.Result
	later := func(d time.Duration) {
		if result.RequeueAfter == 0 || d < result.RequeueAfter {
			result.RequeueAfter = d
		}
	}

	claims, err := r.claimsOf(ctx, req.Namespace, req.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if d, err := r.releaseGone(ctx, req.Namespace, vm, vmi, claims); err != nil {
		return reconcile.Result{}, err
	} else if d > 0 {
		later(d)
	}
	leases.set(req.String(), keptLeases(claims))

	cfg := r.Config.Get()
	live, liveObj, spec := liveOwner(vm, vmi)
	key := req.String()
	if spec == nil || !cfg.PersistentIPsEnabled() || cfg.Excluded(req.Namespace) {
		r.leaks.set(key, 0)
		return result, nil
	}
	want, skipped, err := Desired(ctx, cfg, live, spec, r.Facts)
	if err != nil {
		return reconcile.Result{}, err
	}
	for _, s := range skipped {
		log.V(1).Info("network gets no IPAMClaim", "network", s.Network, "reason", s.Reason)
	}
	wanted := map[string]bool{}
	for _, w := range want {
		wanted[w.Claim.Name] = true
		d, err := r.ensure(ctx, liveObj, live, w)
		if err != nil {
			return reconcile.Result{}, err
		}
		if d > 0 {
			later(d)
		}
	}
	unused := 0
	for i := range claims {
		if live.Owns(&claims[i]) && claims[i].DeletionTimestamp == nil && !wanted[claims[i].Name] {
			unused++
		}
	}
	r.leaks.set(key, unused)
	return result, nil
}

// releaseGone releases the claims (kvnet's finalizer on) whose VM is gone
// or being deleted, or whose standalone VMI is gone and its launcher pod
// no longer active. It returns when to look again for a claim held by a
// launcher pod still running (0: no such claim).
func (r *Reconciler) releaseGone(ctx context.Context, namespace string, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, claims []ipamv1alpha1.IPAMClaim) (time.Duration, error) {
	var again time.Duration
	for i := range claims {
		c := &claims[i]
		if !controllerutil.ContainsFinalizer(c, Finalizer) {
			continue
		}
		ref := metav1.GetControllerOf(c)
		switch ref.Kind {
		case owner.KindVM:
			if vm != nil && vm.UID == ref.UID && vm.DeletionTimestamp == nil {
				continue
			}
			reason := ReasonVMDeleted
			if l, ok := LeaseOf(c); ok {
				why := c.Annotations[LeaseReleaseAnnotation]
				if why == "" {
					logf.FromContext(ctx).Info("the VM is gone but moved to another cluster: keeping its claim as a lease", "claim", c.Name, "peer", l.Peer, "migrationID", l.MigrationID)
					continue
				}
				logf.FromContext(ctx).Info("releasing a lease at an operator's request", "claim", c.Name, "peer", l.Peer, "migrationID", l.MigrationID, "why", why)
				reason = ReasonLeaseReleased
			}
			if err := r.release(ctx, c, reason); err != nil {
				return 0, err
			}
		case owner.KindVMI:
			if vmi != nil && vmi.UID == ref.UID {
				continue // a standalone VMI keeps its IP until it is gone
			}
			active, err := r.launcherActive(ctx, namespace, ref.UID)
			if err != nil {
				return 0, err
			}
			if active {
				logf.FromContext(ctx).V(1).Info("standalone VMI is gone but its launcher pod is still active; keeping the claim", "claim", c.Name)
				claimsHeld.Inc()
				again = waitForLauncher // pod events requeue sooner; this is a safety net
				continue
			}
			if err := r.release(ctx, c, ReasonVMIGone); err != nil {
				return 0, err
			}
		}
	}
	return again, nil
}

// keptLeases are the leases among claims that kvnet's finalizer holds.
func keptLeases(claims []ipamv1alpha1.IPAMClaim) []Lease {
	var out []Lease
	for i := range claims {
		if l, ok := LeaseOf(&claims[i]); ok && controllerutil.ContainsFinalizer(&claims[i], Finalizer) {
			out = append(out, l)
		}
	}
	return out
}

// liveOwner is the object whose claims should exist: the VM, unless it is
// being deleted or has no template, else a standalone VMI not being
// deleted; with its VMI spec. spec is nil when there is none.
func liveOwner(vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance) (Owner, client.Object, *kubevirtv1.VirtualMachineInstanceSpec) {
	switch {
	case vm != nil:
		if vm.DeletionTimestamp == nil && vm.Spec.Template != nil {
			return Owner{Kind: owner.KindVM, Namespace: vm.Namespace, Name: vm.Name, UID: vm.UID}, vm, &vm.Spec.Template.Spec
		}
	case vmi != nil:
		if o := OwnerOf(vmi); o.Kind == owner.KindVMI && vmi.DeletionTimestamp == nil {
			return o, vmi, &vmi.Spec
		}
	}
	return Owner{}, nil, nil
}

// claimsOf lists the claims controlled by a VM or VMI called name.
func (r *Reconciler) claimsOf(ctx context.Context, namespace, name string) ([]ipamv1alpha1.IPAMClaim, error) {
	var out []ipamv1alpha1.IPAMClaim
	for _, kind := range []string{owner.KindVM, owner.KindVMI} {
		var list ipamv1alpha1.IPAMClaimList
		if err := r.Client.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{ownerIndex: kind + "/" + name}); err != nil {
			return nil, fmt.Errorf("listing IPAMClaims of %s %s/%s: %w", kind, namespace, name, err)
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

// ensure makes one wanted claim exist and carry kvnet's finalizer and label.
// It returns a delay when it must look again later.
func (r *Reconciler) ensure(ctx context.Context, ownerObj client.Object, o Owner, w WantedClaim) (time.Duration, error) {
	log := logf.FromContext(ctx).WithValues("claim", w.Claim.Name, "network", w.Network)
	var cur ipamv1alpha1.IPAMClaim
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(w.Claim), &cur)
	switch {
	case apierrors.IsNotFound(err):
		c := w.Claim.DeepCopy()
		if err := r.Client.Create(ctx, c); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return time.Second, nil // the cache is behind; look again
			}
			return 0, fmt.Errorf("creating IPAMClaim %s/%s: %w", c.Namespace, c.Name, err)
		}
		claimsCreated.Inc()
		log.Info("created IPAMClaim", "owner", o.Kind+"/"+o.Name, "spec.network", c.Spec.Network, "spec.interface", c.Spec.Interface)
		r.event(ownerObj, c, corev1.EventTypeNormal, eventReasonClaim, "Create",
			"IPAMClaim %s keeps the IP of network %s across restarts and migrations", c.Name, w.Network)
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("reading IPAMClaim %s/%s: %w", w.Claim.Namespace, w.Claim.Name, err)
	}
	if o.Owns(&cur) {
		// A claim of the same network is the VM's claim, whoever created
		// it: kubevirt/ipam-extensions leaves spec.interface empty, and
		// replacing such a claim would free the VM's IP, so it is adopted
		// in place. Only a claim of another network, or of another named
		// interface, is replaced.
		if cur.Spec.Network != w.Claim.Spec.Network || cur.Spec.Interface != "" && cur.Spec.Interface != w.Claim.Spec.Interface {
			return r.replace(ctx, ownerObj, w, &cur)
		}
		if cur.DeletionTimestamp != nil {
			// Someone deleted a claim its VM still uses; the finalizer keeps it
			// (and the IP) until the VM goes.
			return 0, nil
		}
		if controllerutil.ContainsFinalizer(&cur, Finalizer) && controllerutil.ContainsFinalizer(&cur, peers.IPAMExtensionsFinalizer) {
			return 0, r.takeOver(ctx, &cur)
		}
		base := cur.DeepCopy()
		changed := controllerutil.AddFinalizer(&cur, Finalizer)
		if v := vmLabelValue(o.Name); v != "" && cur.Labels[VMLabel] != v {
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			cur.Labels[VMLabel] = v
			changed = true
		}
		if !changed {
			return 0, nil
		}
		if err := r.Client.Patch(ctx, &cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return 0, fmt.Errorf("adding kvnet's finalizer to IPAMClaim %s/%s: %w", cur.Namespace, cur.Name, err)
		}
		return 0, nil
	}
	if ref := owner.ControllingKubeVirt(&cur); ref != nil && ref.Name == o.Name {
		// The claim of an earlier VM (or standalone VMI) with the same name:
		// released above (or once its launcher pod is gone), it waits for
		// the garbage collector. The new owner's claim comes after.
		log.V(1).Info("waiting for the claim of a previous object with the same name to be garbage-collected", "previousUID", ref.UID)
		return waitForGC, nil
	}
	return 0, r.conflict(ctx, ownerObj, o, w, &cur)
}

// takeOver removes kubevirt/ipam-extensions' finalizer from a claim kvnet
// has adopted (its own finalizer is on, added by an earlier write) once
// ipam-extensions is uninstalled (its webhook gone): nobody else would
// ever remove it, and the claim, with its IP, would outlive its VM. While
// ipam-extensions is registered, its finalizer is its own to remove.
func (r *Reconciler) takeOver(ctx context.Context, c *ipamv1alpha1.IPAMClaim) error {
	registered, err := r.Facts.IPAMExtensions(ctx)
	if err != nil || registered != "" {
		return err
	}
	base := c.DeepCopy()
	controllerutil.RemoveFinalizer(c, peers.IPAMExtensionsFinalizer)
	if err := r.Client.Patch(ctx, c, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("removing ipam-extensions' finalizer from IPAMClaim %s/%s: %w", c.Namespace, c.Name, err)
	}
	claimsTakenOver.Inc()
	logf.FromContext(ctx).Info("took over an IPAMClaim from ipam-extensions, which is no longer installed: removed its finalizer, kvnet's holds the claim",
		"claim", c.Name, "finalizer", peers.IPAMExtensionsFinalizer, "ips", c.Status.IPs)
	return nil
}

// replace deletes an own claim that no longer matches the network it is
// for, so that the next reconcile creates it again for the network the VM
// now attaches. That happens when a running VM's network is pointed at a NAD
// of another network (KubeVirt's LiveUpdateNADRef) or when the NAD's config
// changes its "name". The claim's IP is an address on the old network: the
// IPAM plugin ignores a claim whose spec.network is not the pod's network
// (OVN-Kubernetes does), and spec.network cannot carry the address over to
// another network, so kvnet does not edit the claim in place. The VM gets a
// new persistent IP on the new network; the event says which it lost.
func (r *Reconciler) replace(ctx context.Context, ownerObj client.Object, w WantedClaim, cur *ipamv1alpha1.IPAMClaim) (time.Duration, error) {
	log := logf.FromContext(ctx).WithValues("claim", cur.Name, "network", w.Network)
	if cur.DeletionTimestamp == nil {
		// Delete first, finalizer second: once the finalizer is gone the
		// API server removes the claim at once, and a reconcile that comes
		// in between sees a claim being deleted, not a stale live one.
		uid, rv := cur.UID, cur.ResourceVersion
		if err := r.Client.Delete(ctx, cur, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil {
			if apierrors.IsNotFound(err) {
				return time.Second, nil
			}
			return 0, fmt.Errorf("deleting IPAMClaim %s/%s of network %q to recreate it for network %q: %w", cur.Namespace, cur.Name, cur.Spec.Network, w.Claim.Spec.Network, err)
		}
		log.Info("deleted IPAMClaim whose network changed; it is created again for the new network",
			"old spec.network", cur.Spec.Network, "new spec.network", w.Claim.Spec.Network, "released IPs", cur.Status.IPs)
		r.event(ownerObj, cur, corev1.EventTypeWarning, eventReasonReplaced, "Recreate",
			"network %s now attaches network %q (NetworkAttachmentDefinition %s) instead of %q: IPAMClaim %s is created again for it, so the IPs %v on %q are released and the VM gets a new persistent IP",
			w.Network, w.Claim.Spec.Network, w.NAD.Ref(), cur.Spec.Network, cur.Name, cur.Status.IPs, cur.Spec.Network)
	}
	if controllerutil.ContainsFinalizer(cur, Finalizer) {
		var fresh ipamv1alpha1.IPAMClaim
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(cur), &fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return time.Second, nil
			}
			return 0, fmt.Errorf("reading IPAMClaim %s/%s: %w", cur.Namespace, cur.Name, err)
		}
		if err := r.release(ctx, &fresh, ReasonNetworkChanged); err != nil {
			return 0, err
		}
	}
	// The claim's deletion event brings the owner back; this is a safety net.
	return time.Second, nil
}

// conflict reports a claim kvnet wanted but another object controls: an
// event on the VM, where its owner looks, and a condition on the claim,
// where the claim's owner looks. kvnet never adopts it, and the pod mutator
// does not reference it.
func (r *Reconciler) conflict(ctx context.Context, ownerObj client.Object, o Owner, w WantedClaim, cur *ipamv1alpha1.IPAMClaim) error {
	holder := "no controlling owner"
	reason := "NoController"
	if ref := metav1.GetControllerOf(cur); ref != nil {
		holder = fmt.Sprintf("controlled by %s %s", ref.Kind, ref.Name)
		reason = "ControlledByAnotherObject"
	}
	msg := fmt.Sprintf("kvnet did not adopt this claim for %s %s network %s: it has %s", o.Kind, o.Name, w.Network, holder)
	base := cur.DeepCopy()
	if !meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{
		Type: ConflictCondition, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: cur.Generation,
	}) {
		return nil // already reported
	}
	claimConflicts.Inc()
	logf.FromContext(ctx).Info("IPAMClaim has another owner; not adopting it", "claim", cur.Name, "network", w.Network, "holder", holder)
	r.event(ownerObj, cur, corev1.EventTypeWarning, eventReasonConflict, "Adopt",
		"IPAMClaim %s exists with %s; kvnet does not adopt it, so network %s gets no persistent IP", cur.Name, holder, w.Network)
	if cur.Status.IPs == nil {
		cur.Status.IPs = []string{} // required by the CRD schema
	}
	if err := r.Client.Status().Patch(ctx, cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("setting condition %s on IPAMClaim %s/%s: %w", ConflictCondition, cur.Namespace, cur.Name, err)
	}
	return nil
}

// release removes kvnet's finalizer; the API server's garbage collector then
// deletes the claim, whose owner is gone or going.
func (r *Reconciler) release(ctx context.Context, c *ipamv1alpha1.IPAMClaim, reason string) error {
	base := c.DeepCopy()
	controllerutil.RemoveFinalizer(c, Finalizer)
	if err := r.Client.Patch(ctx, c, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("removing kvnet's finalizer from IPAMClaim %s/%s: %w", c.Namespace, c.Name, err)
	}
	claimsReleased.WithLabelValues(reason).Inc()
	logf.FromContext(ctx).Info("released IPAMClaim", "claim", c.Name, "reason", reason)
	return nil
}

// launcherActive reports whether a virt-launcher pod of the VMI with uid has
// not finished: its IP is in use until it has.
func (r *Reconciler) launcherActive(ctx context.Context, namespace string, uid types.UID) (bool, error) {
	var pods corev1.PodList
	if err := r.Pods.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{kubevirtv1.CreatedByLabel: string(uid)}); err != nil {
		return false, fmt.Errorf("listing virt-launcher pods of VMI %s in %s: %w", uid, namespace, err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return true, nil
		}
	}
	return false, nil
}

func (r *Reconciler) event(regarding, related client.Object, typ, reason, action, note string, args ...any) {
	if r.Events != nil {
		r.Events.Eventf(regarding, related, typ, reason, action, note, args...)
	}
}

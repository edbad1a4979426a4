package framework

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
)

// ClaimWatch records every IPAMClaim event of a namespace that would cost
// a VM its IP: a deletion (including a deletionTimestamp a finalizer holds
// up), a change of a claim's UID or of status.ips once set, and, while the
// claims' VMs are still there, the last finalizer going. A move between
// IPAM owners (ipam-extensions to kvnet) must make none of them.
type ClaimWatch struct {
	mu      sync.Mutex
	ownerGo bool // the VMs are being deleted: their claims may lose their finalizers
	deleted []string
	changed []string
	last    map[string]*ipamv1alpha1.IPAMClaim
}

// WatchClaims watches namespace ns's IPAMClaims until t ends.
func (e *Env) WatchClaims(t *testing.T, ns string) *ClaimWatch {
	t.Helper()
	wc, err := client.NewWithWatch(e.Config, client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &ipamv1alpha1.IPAMClaimList{}, client.InNamespace(ns))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	cw := &ClaimWatch{last: map[string]*ipamv1alpha1.IPAMClaim{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if c, ok := ev.Object.(*ipamv1alpha1.IPAMClaim); ok {
				cw.see(ev.Type, c)
			}
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return cw
}

func (cw *ClaimWatch) see(typ watch.EventType, c *ipamv1alpha1.IPAMClaim) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	prev := cw.last[c.Name]
	switch {
	case typ == watch.Deleted:
		cw.deleted = append(cw.deleted, c.Name)
	case c.DeletionTimestamp != nil && (prev == nil || prev.DeletionTimestamp == nil):
		// Deleted, held only by a finalizer: the IP goes with it.
		cw.deleted = append(cw.deleted, c.Name+" (deletionTimestamp set)")
	case prev != nil && prev.UID != c.UID:
		cw.changed = append(cw.changed, fmt.Sprintf("%s: UID %s -> %s", c.Name, prev.UID, c.UID))
	case prev != nil && len(prev.Status.IPs) > 0 && !slices.Equal(prev.Status.IPs, c.Status.IPs):
		cw.changed = append(cw.changed, fmt.Sprintf("%s: status.ips %v -> %v", c.Name, prev.Status.IPs, c.Status.IPs))
	case !cw.ownerGo && prev != nil && c.DeletionTimestamp == nil && len(prev.Finalizers) > 0 && len(c.Finalizers) == 0:
		// Neither the old owner's finalizer nor kvnet's holds a claim
		// whose VM is still there.
		cw.changed = append(cw.changed, fmt.Sprintf("%s: finalizers %v -> none", c.Name, prev.Finalizers))
	}
	cw.last[c.Name] = c
}

// Check fails t on any deletion or change seen so far.
func (cw *ClaimWatch) Check(t testing.TB) {
	t.Helper()
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if len(cw.deleted) > 0 || len(cw.changed) > 0 {
		t.Fatalf("IPAMClaims deleted %q, changed %q", cw.deleted, cw.changed)
	}
}

// OwnersGoing checks what was seen so far, then tells the watch that the
// claims' VMs are being deleted: from then on their claims may lose their
// finalizers (and be deleted by the garbage collector).
func (cw *ClaimWatch) OwnersGoing(t testing.TB) {
	t.Helper()
	cw.Check(t)
	cw.mu.Lock()
	cw.ownerGo = true
	cw.mu.Unlock()
}

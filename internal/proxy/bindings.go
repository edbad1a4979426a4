package proxy

import (
	"context"
	"sync"

	"github.com/kvnet/kvnet/internal/proxy/store"
)

// Bindings decide whether a peer may stream for a migration: the first
// peer to present an ID gets it, any other is refused, so no second trusted
// peer can take over or inject into a migration. Bind must have made the
// decision durable before it returns true: the target writes "accepted"
// right after.
type Bindings interface {
	Bind(ctx context.Context, b store.Binding) (bool, error)
}

// memoryBindings is the default of a TargetServer without a store: one
// process's memory, lost on restart and never shrunk. Only for tests and
// for a target side without an API server.
type memoryBindings struct {
	mu    sync.Mutex
	bound map[string]string // migration ID -> peer
}

func (m *memoryBindings) Bind(_ context.Context, b store.Binding) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bound == nil {
		m.bound = map[string]string{}
	}
	if cur, ok := m.bound[b.MigrationID]; ok {
		return cur == b.Peer, nil
	}
	m.bound[b.MigrationID] = b.Peer
	return true, nil
}

// Package hop is the wire protocol between two kvnet proxies: the three
// request kinds a source proxy sends over mutual TLS (a stream's
// preamble, a CA bundle offer, a migration's network identity), the route
// each names, and the one-byte verdict that answers it. It knows nothing
// of listeners, stores or Kubernetes objects, so that every byte a peer can
// send is read, bounded and fuzzed here.
package hop

// Package store holds the proxy's two ConfigMaps in kvnet's namespace:
// the mappings a source proxy publishes for the status rewrite, and the
// bindings of each received migration to the peer that first presented
// it. Only the proxy's ServiceAccount writes them, so what a tenant writes
// never steers a stream.
package store

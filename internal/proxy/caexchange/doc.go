// Package caexchange keeps KubeVirt's CA bundles of this cluster and its
// peers in step: it offers this cluster's own CAs from kubevirt-ca to every
// peer, and merges what a peer offers, checked, into that peer's slot of
// kubevirt-external-ca, where virt-operator takes it. The proxy carries
// the offers over the hop; this package decides what is offered and kept.
package caexchange

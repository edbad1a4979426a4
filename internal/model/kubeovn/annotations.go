// Package kubeovn names the per-attachment annotations kube-ovn reads from a
// virt-launcher pod. Each is a suffix: the attachment's provider
// (the NAD config's provider, else "<nad>.<namespace>.ovn"; see
// netattach.Info.KubeOVNProvider) comes first.
// The mutators write them on the VMI template; the validators check what a
// user wrote by hand.
package kubeovn

const (
	// IPAddress is the attachment's fixed IPs, comma-separated, without
	// prefix lengths.
	IPAddress = ".kubernetes.io/ip_address"
	// MACAddress is the attachment's fixed MAC.
	MACAddress = ".kubernetes.io/mac_address"
	// LogicalSwitch is the kube-ovn subnet the attachment takes its address from.
	LogicalSwitch = ".kubernetes.io/logical_switch"
	// DefaultRoute set to "true" gives the attachment the pod's default route.
	DefaultRoute = ".kubernetes.io/default_route"
	// AllowLiveMigration set to "true" lets source and target pod share the
	// attachment's IP during a live migration (kube-ovn up to v1.12).
	AllowLiveMigration = ".kubernetes.io/allow_live_migration"
)

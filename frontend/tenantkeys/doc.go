// Package tenantkeys keeps the tenants' account keys as the master last
// gave them, for the Azure services' signature checks (sharedkey.Keys):
// the Table gateway and the Queue service share it. A Cache is safe for
// concurrent use.
package tenantkeys

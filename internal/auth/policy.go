package auth

import (
	"strings"

	"github.com/tabuladb/tabula/api"
)

// Access is who may call a method.
type Access int

const (
	// Deny: nobody (a method no service names).
	Deny Access = iota
	// Tenant: a tenant, for its own tenant only, or the cluster.
	Tenant
	// Cluster: only the cluster credential (operator and cluster
	// processes).
	Cluster
)

// tenantMethods are the RPCs a tenant may call for its own tables. Every
// other method of the Master and TableServer services, and every method
// of the extent-node and raft services, needs the cluster credential.
var tenantMethods = map[string]bool{
	api.Master_CreateTable_FullMethodName:       true,
	api.Master_DropTable_FullMethodName:         true,
	api.Master_ListTables_FullMethodName:        true,
	api.Master_DescribeTable_FullMethodName:     true,
	api.Master_GetPartitionMap_FullMethodName:   true,
	api.Master_WatchPartitionMap_FullMethodName: true,
	api.Master_BulkPublish_FullMethodName:       true,
	api.Master_BulkStatus_FullMethodName:        true,
	api.Master_BulkRollback_FullMethodName:      true,
	api.Master_BulkRollout_FullMethodName:       true,
	api.Master_CoprocDeploy_FullMethodName:      true,
	api.Master_CoprocList_FullMethodName:        true,
	api.Master_CoprocRollback_FullMethodName:    true,
	api.Master_CoprocFetch_FullMethodName:       true,
	api.Master_ListDataLoss_FullMethodName:      true,
	api.Master_DescribeTenant_FullMethodName:    true,

	api.TableServer_Get_FullMethodName:              true,
	api.TableServer_BatchGet_FullMethodName:         true,
	api.TableServer_MultiGet_FullMethodName:         true,
	api.TableServer_Put_FullMethodName:              true,
	api.TableServer_Delete_FullMethodName:           true,
	api.TableServer_CompareAndSwap_FullMethodName:   true,
	api.TableServer_BatchWrite_FullMethodName:       true,
	api.TableServer_Scan_FullMethodName:             true,
	api.TableServer_BulkUpload_FullMethodName:       true,
	api.TableServer_BulkUploadStatus_FullMethodName: true,
	api.TableServer_Invoke_FullMethodName:           true,
	api.TableServer_CoprocMerge_FullMethodName:      true,
	api.TableServer_Calls_FullMethodName:            true,
}

// servicePrefixes are the services this package knows; a method of any
// other service is denied.
var servicePrefixes = []string{"/tabula.v1.Master/", "/tabula.v1.TableServer/", "/tabula.stream.v1.ExtentNode/", "/tabula.v1.Raft/"}

// MethodAccess is the access rule of every Tabula RPC.
func MethodAccess(fullMethod string) Access {
	if tenantMethods[fullMethod] {
		return Tenant
	}
	for _, p := range servicePrefixes {
		if strings.HasPrefix(fullMethod, p) {
			return Cluster
		}
	}
	return Deny
}

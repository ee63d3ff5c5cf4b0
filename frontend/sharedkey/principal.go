package sharedkey

import (
	"fmt"
	"strings"
	"time"
)

// Kind is how a request proved who it is.
type Kind uint8

const (
	KindSharedKey Kind = iota + 1
	KindSharedKeyLite
	KindServiceSAS
	KindAccountSAS
	// KindBearer is an OAuth bearer token (the gateway verifies it with
	// frontend/bearer and sets Perms from the principal's role).
	KindBearer
)

func (k Kind) String() string {
	switch k {
	case KindSharedKey:
		return "SharedKey"
	case KindSharedKeyLite:
		return "SharedKeyLite"
	case KindServiceSAS:
		return "ServiceSAS"
	case KindAccountSAS:
		return "AccountSAS"
	case KindBearer:
		return "Bearer"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Perm is a set of SAS permissions.
type Perm uint16

const (
	PermRead    Perm = 1 << iota // r
	PermAdd                      // a
	PermCreate                   // c (account SAS)
	PermWrite                    // w (account SAS)
	PermDelete                   // d
	PermList                     // l (account SAS)
	PermUpdate                   // u
	PermProcess                  // p (account SAS; no table operation needs it)

	// PermAll is what a Shared Key holder has.
	PermAll = PermRead | PermAdd | PermCreate | PermWrite | PermDelete | PermList | PermUpdate | PermProcess
)

const permLetters = "racwdlup" // bit i is letter i

func (p Perm) String() string {
	var b strings.Builder
	for i := range len(permLetters) {
		if p&(1<<i) != 0 {
			b.WriteByte(permLetters[i])
		}
	}
	return b.String()
}

// ResourceType is a set of an account SAS's resource types (srt).
type ResourceType uint8

const (
	ResService   ResourceType = 1 << iota // s: service properties and stats
	ResContainer                          // c: tables
	ResObject                             // o: entities

	ResAll = ResService | ResContainer | ResObject
)

// KeyRange is a service SAS's range of entities: from (StartPK, StartRK)
// to (EndPK, EndRK), both ends included, compared as (PartitionKey,
// RowKey) pairs. An empty start or end is unbounded.
type KeyRange struct {
	StartPK, StartRK, EndPK, EndRK string
}

// IsZero says the range is the whole table.
func (k KeyRange) IsZero() bool { return k == KeyRange{} }

// Contains says whether entity (pk, rk) lies in the range.
func (k KeyRange) Contains(pk, rk string) bool {
	if k.StartPK != "" && (pk < k.StartPK || pk == k.StartPK && rk < k.StartRK) {
		return false
	}
	if k.EndPK != "" && (pk > k.EndPK || pk == k.EndPK && k.EndRK != "" && rk > k.EndRK) {
		return false
	}
	return true
}

// Principal is who a verified request comes from and what it may do.
type Principal struct {
	Account   string // the account (tenant), without "-secondary"
	Secondary bool   // the request addressed account-secondary (read-only; the gateway enforces that)
	Kind      Kind
	// Perms: PermAll for Shared Key; the SAS's sp otherwise.
	Perms Perm
	// ResourceTypes: the account SAS's srt; ResAll for Shared Key.
	ResourceTypes ResourceType
	// Table is a service SAS's table (tn), lower-case; "" otherwise.
	Table string
	// Keys is a service SAS's entity range; the gateway clips queries
	// to it.
	Keys KeyRange
	// Version is a SAS's sv: the service processes the request at this
	// version, whatever x-ms-version says. "" for Shared Key.
	Version string
	// Start and Expiry bound a SAS's validity (zero: unbounded start).
	Start, Expiry time.Time
}

// Op is an operation of the Table service, as far as authorization
// cares.
type Op uint8

const (
	OpQueryTables Op = iota + 1
	OpCreateTable
	OpDeleteTable
	OpGetTableACL
	OpSetTableACL
	OpQueryEntities
	OpGetEntity
	OpInsertEntity
	OpUpdateEntity
	OpMergeEntity
	OpDeleteEntity
	OpInsertOrReplaceEntity
	OpInsertOrMergeEntity
	OpGetServiceProperties
	OpSetServiceProperties
	OpGetServiceStats
)

// need is what an operation needs from a SAS: a resource type among
// res (account SAS), one permission among anyOf and all of allOf.
type need struct {
	res          ResourceType
	anyOf, allOf Perm
	entity       bool // an entity operation (service SAS scope)
}

// From "Create an account SAS" and "Create a service SAS" (table
// service): an upsert needs both add and update.
var needs = map[Op]need{
	OpGetServiceProperties:  {res: ResService, anyOf: PermRead},
	OpSetServiceProperties:  {res: ResService, anyOf: PermWrite},
	OpGetServiceStats:       {res: ResService, anyOf: PermRead},
	OpQueryTables:           {res: ResContainer, anyOf: PermList},
	OpCreateTable:           {res: ResContainer, anyOf: PermCreate | PermWrite},
	OpDeleteTable:           {res: ResContainer, anyOf: PermDelete},
	OpGetTableACL:           {res: ResContainer}, // never through a SAS
	OpSetTableACL:           {res: ResContainer},
	OpQueryEntities:         {res: ResObject | ResContainer, anyOf: PermRead, entity: true},
	OpGetEntity:             {res: ResObject, anyOf: PermRead, entity: true},
	OpInsertEntity:          {res: ResObject, anyOf: PermAdd, entity: true},
	OpUpdateEntity:          {res: ResObject, anyOf: PermUpdate, entity: true},
	OpMergeEntity:           {res: ResObject, anyOf: PermUpdate, entity: true},
	OpDeleteEntity:          {res: ResObject, anyOf: PermDelete, entity: true},
	OpInsertOrReplaceEntity: {res: ResObject, allOf: PermAdd | PermUpdate, entity: true},
	OpInsertOrMergeEntity:   {res: ResObject, allOf: PermAdd | PermUpdate, entity: true},
}

// Allows says whether p may perform op on table (for table and entity
// operations) and entity (pk, rk) (for point operations; "" for
// queries, which the gateway clips to p.Keys instead). It returns nil
// or an *Error: AuthorizationPermissionMismatch for a missing
// permission, AuthorizationResourceTypeMismatch for an operation outside
// an account SAS's srt or a service SAS's table scope, and
// AuthorizationFailure for another table or an entity outside the key
// range.
func (p Principal) Allows(op Op, table, pk, rk string) error {
	n, ok := needs[op]
	if !ok {
		return fmt.Errorf("sharedkey: unknown operation %d", op)
	}
	switch p.Kind {
	case KindSharedKey, KindSharedKeyLite:
		return nil
	case KindServiceSAS:
		if !n.entity {
			return errResourceType()
		}
		if !strings.EqualFold(table, p.Table) {
			return errFailure()
		}
	case KindAccountSAS:
		if p.ResourceTypes&n.res == 0 {
			return errResourceType()
		}
	case KindBearer:
		// Table ACLs are for Shared Key only, as the service has it.
		if op == OpGetTableACL || op == OpSetTableACL {
			return errFailure()
		}
		if p.Perms&n.anyOf == 0 && n.anyOf != 0 || p.Perms&n.allOf != n.allOf {
			return errPermission()
		}
		return nil
	default:
		return errFailure()
	}
	if n.anyOf == 0 && n.allOf == 0 || n.anyOf != 0 && p.Perms&n.anyOf == 0 || p.Perms&n.allOf != n.allOf {
		return errPermission()
	}
	if p.Kind == KindServiceSAS && (pk != "" || rk != "") && !p.Keys.Contains(pk, rk) {
		return errFailure()
	}
	return nil
}

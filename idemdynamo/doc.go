// Package idemdynamo is an idem.Store on Amazon DynamoDB, through the AWS
// SDK for Go v2.
//
//	client := dynamodb.NewFromConfig(awsConfig)
//	if _, err := idemdynamo.CreateTable(ctx, client, "idem_keys"); err != nil { … }
//	store, err := idemdynamo.NewStore(client, &idemdynamo.Config{Table: "idem_keys", Transactional: true})
//	engine, err := idem.NewEngine(store, nil)
//
// # The answer and the business items in one transaction
//
// When the handler's business data lives in DynamoDB, it adds its writes
// to the unit of work instead of sending them:
//
//	err := idemdynamo.Tx(ctx).Add(types.TransactWriteItem{Put: &types.Put{
//		TableName: aws.String("orders"), Item: order,
//		ConditionExpression: aws.String("attribute_not_exists(pk)"),
//	}})
//
// and the completion commits them with the record in one
// TransactWriteItems whose last action is the record's update, fenced by
// the lease token: either the items and the stored answer both exist, or
// neither does. An execution whose lease was taken over has its whole
// transaction cancelled; a business write's own condition that fails
// cancels the record's completion too. Set Config.Transactional when every
// business write of the handlers goes through Tx (see its doc).
//
// # Claims and the fence
//
// A claim is one conditional PutItem (no record, or one past retention); a
// takeover (in flight, lease ended, same fingerprint) is one conditional
// UpdateItem, which keeps the recovery points. A lost claim reads the
// record with a consistent GetItem. The completion, the heartbeat, the
// release and the recovery points are each one write conditional on the
// record being in flight under the holder's token: a late holder is
// refused, never able to overwrite or delete the record of the execution
// that took over.
//
// # Clocks
//
// DynamoDB offers no clock a condition can read, so leases and retention
// are decided by the application's clock (Config.NowFunc), written into
// the item as Unix milliseconds. A process whose clock runs ahead would
// see leases end early and take a live key over; Config.MaxClockSkew
// (default 1s) is added to every lease and retention check, so a skew up
// to that bound is harmless, at the cost of takeovers that much later.
// Keep the processes' clocks synchronised (the Amazon Time Sync Service
// keeps EC2 hosts within a millisecond) and MaxClockSkew well above their
// worst offset. A completion is fenced by the token alone, so skew never
// makes a completion succeed or fail.
//
// # Retention
//
// Each item carries its end of retention twice: "exp" in milliseconds,
// which every read compares (a record past it counts as absent whether or
// not it was deleted), and "ttl" in seconds, MaxClockSkew later, for
// DynamoDB's TTL, which CreateTable turns on: DynamoDB then deletes
// expired items itself, at no cost, usually within a few days. Purge
// scans the table and is for endpoints without TTL.
//
// # Layout
//
// One item per record, keyed by the string partition key "pk", which
// encodes tenant and key together: DynamoDB hashes it, so the keys of
// every tenant spread over every partition. A body over 300 kB goes to
// chunk items of its own, written before the completion names them.
//
// The store was tested on dynalite and minidyn (DynamoDB-compatible
// servers run locally), not on AWS; docs/STORES.md says where they differ
// from DynamoDB and how the store avoids depending on the difference.
package idemdynamo

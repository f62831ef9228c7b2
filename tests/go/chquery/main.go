// Command chquery runs SQL through clickhouse-go v2 over HTTP, configured as Grafana's ClickHouse plugin
// configures it (database/sql via clickhouse.OpenDB, protocol HTTP, gzip compression, a per-query
// deadline), and prints each result as one JSON line. The tests use it to check that the embedded
// store's HTTP interface serves the plugin's driver (tests/integration/test_store_http_go.py).
//
//	chquery -addr 127.0.0.1:8123 -database ttft [-password pw] < queries.jsonl
//
// Each input line is {"id": "...", "sql": "..."}; each output line is {"id", "columns": [[name, type]],
// "rows": [[...]]} or {"id", "error", "code"}. Values are normalised so that another client's rows compare
// equal: times as integer microseconds since the epoch, non-finite floats as strings, maps with string keys.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/google/uuid"
	"github.com/shopspring/decimal"
)

type query struct {
	ID  string `json:"id"`
	SQL string `json:"sql"`
}

type result struct {
	ID      string      `json:"id"`
	Columns [][2]string `json:"columns"`
	Rows    [][]any     `json:"rows"`
}

type failure struct {
	ID    string `json:"id"`
	Error string `json:"error"`
	Code  int    `json:"code"`
}

// exceptionCode reads "Code: N." from an error: over HTTP this driver version reports the server's
// exception as the response body's text.
var exceptionCode = regexp.MustCompile(`Code: (\d+)\.`)

func main() {
	addr := flag.String("addr", "127.0.0.1:8123", "host:port of the HTTP interface")
	database := flag.String("database", "default", "default database (the datasource's defaultDatabase)")
	password := flag.String("password", "", "password of user default")
	compression := flag.String("compression", "gzip", "gzip (the plugin over HTTP) or none")
	timeout := flag.Duration("timeout", 30*time.Second, "per-query deadline (the plugin's query timeout)")
	flag.Parse()

	method := clickhouse.CompressionGZIP
	if *compression == "none" {
		method = clickhouse.CompressionNone
	}
	db := clickhouse.OpenDB(&clickhouse.Options{
		Addr:        []string{*addr},
		Auth:        clickhouse.Auth{Database: *database, Username: "default", Password: *password},
		Protocol:    clickhouse.HTTP,
		Compression: &clickhouse.Compression{Method: method},
		DialTimeout: 10 * time.Second,
		ReadTimeout: *timeout,
	})
	defer db.Close()

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var q query
		if err := json.Unmarshal(in.Bytes(), &q); err != nil {
			fmt.Fprintln(os.Stderr, "bad input line:", err)
			os.Exit(2)
		}
		if err := out.Encode(run(db, q, *timeout)); err != nil {
			fmt.Fprintln(os.Stderr, "cannot encode a result:", err)
			os.Exit(1)
		}
	}
}

func run(db *sql.DB, q query, timeout time.Duration) any {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rows, err := db.QueryContext(ctx, q.SQL)
	if err != nil {
		return failed(q.ID, err)
	}
	defer rows.Close()
	types, err := rows.ColumnTypes()
	if err != nil {
		return failed(q.ID, err)
	}
	res := result{ID: q.ID, Columns: [][2]string{}, Rows: [][]any{}}
	for _, t := range types {
		res.Columns = append(res.Columns, [2]string{t.Name(), t.DatabaseTypeName()})
	}
	for rows.Next() {
		values := make([]any, len(types))
		targets := make([]any, len(types))
		for i := range values {
			targets[i] = &values[i]
		}
		if err := rows.Scan(targets...); err != nil {
			return failed(q.ID, err)
		}
		row := make([]any, len(values))
		for i, v := range values {
			row[i] = plain(reflect.ValueOf(v))
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return failed(q.ID, err)
	}
	return res
}

func failed(id string, err error) failure {
	res := failure{ID: id, Error: err.Error()}
	var exception *clickhouse.Exception
	if errors.As(err, &exception) {
		res.Code = int(exception.Code)
	} else if found := exceptionCode.FindStringSubmatch(err.Error()); found != nil {
		res.Code, _ = strconv.Atoi(found[1])
	}
	return res
}

// plain turns a scanned value into JSON-ready data that compares equal across clients.
func plain(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	switch x := v.Interface().(type) {
	case time.Time:
		return x.UnixMicro()
	case decimal.Decimal:
		return x.String()
	case *big.Int:
		if x == nil {
			return nil
		}
		return x.String()
	case big.Int:
		return x.String()
	case uuid.UUID:
		return x.String()
	case net.IP:
		return x.String()
	case []byte:
		return string(x)
	case float32:
		return finite(float64(x))
	case float64:
		return finite(x)
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return plain(v.Elem())
	case reflect.Slice, reflect.Array:
		items := make([]any, v.Len())
		for i := range items {
			items[i] = plain(v.Index(i))
		}
		return items
	case reflect.Map:
		items := make(map[string]any, v.Len())
		for _, key := range v.MapKeys() {
			items[fmt.Sprint(plain(key))] = plain(v.MapIndex(key))
		}
		return items
	}
	return v.Interface()
}

func finite(f float64) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return f
}

-- specguard's traffic-class router for nginx (lua-nginx-module, lua-cjson).
--
-- Written by `specguard routing render`; the classes come from the JSON file it writes beside
-- this one. The same rules are evaluated in Python by specguard (playbook/routing/classify.py):
-- a change here must be made there too, and the tests hold the two to each other.

local cjson = require "cjson.safe"

cjson.decode_invalid_numbers(false)  -- NaN, Infinity and hex numbers are not JSON

local M = {}

local DICT = "specguard_routing"
local PATHS = { ["/v1/completions"] = true, ["/v1/chat/completions"] = true }
local BUCKETS = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 }
local MISSING = {}  -- a field the body does not give

local rules  -- the rendered JSON: pools, default_pool, fallback_pool, classes, fields

local function read_file(path)
    local file = io.open(path, "rb")
    if not file then
        return nil
    end
    local text = file:read("*a")
    file:close()
    return text
end

-- Called by init_by_lua (nginx start and every reload). The flag is read from its file only when
-- the shared dict does not hold it yet: at start. A reload keeps what the dict holds.
function M.init(rules_path, flag_path)
    local text = read_file(rules_path)
    if not text then
        error("specguard routing: cannot read " .. rules_path)
    end
    rules = cjson.decode(text)
    if type(rules) ~= "table" then
        error("specguard routing: " .. rules_path .. " is not JSON")
    end
    M.flag_path = flag_path
    local dict = ngx.shared[DICT]
    if dict:get("fallback") == nil then
        local engaged = false
        local flag = cjson.decode(read_file(flag_path) or "")
        if type(flag) == "table" and flag.fallback == true then
            engaged = true
        end
        dict:set("fallback", engaged)
        dict:set("fallback_since", ngx.now())
        dict:set("fallback_source", "file")
    end
end

local function count(key)
    ngx.shared[DICT]:incr(key, 1, 0)
end

local function is_array(value)
    -- cjson cannot tell {} from []: an empty table counts as an empty array
    return type(value) == "table" and (value[1] ~= nil or next(value) == nil)
end

local ok_ffi, ffi = pcall(require, "ffi")
local band = bit and bit.band

-- Characters: UTF-8 bytes that do not continue a character, counted by a loop over the bytes that
-- LuaJIT compiles: about 0.2 ms for a 64 KiB prompt, where string.gsub (which builds a copy) takes
-- 1 ms and a pattern search for non-ASCII bytes alone 0.6 ms (benchmarks/bench_routing.py).
local function chars(text)
    if ok_ffi and band then
        local bytes = ffi.cast("const uint8_t *", text)
        local n = 0
        for i = 0, #text - 1 do
            if band(bytes[i], 0xC0) ~= 0x80 then
                n = n + 1
            end
        end
        return n
    end
    local _, n = string.gsub(text, "[^\128-\191]", "")
    return n
end

local function prompt_chars(path, body)
    if path == "/v1/completions" then
        local prompt = body.prompt
        if type(prompt) == "string" then
            return chars(prompt)
        end
        if type(prompt) == "table" and prompt[1] ~= nil then
            local total = 0
            for _, item in ipairs(prompt) do
                if type(item) ~= "string" then
                    return MISSING
                end
                total = total + chars(item)
            end
            return total
        end
        return MISSING
    end
    local messages = body.messages
    if not is_array(messages) then
        return MISSING
    end
    local total = 0
    for _, message in ipairs(messages) do
        local content = type(message) == "table" and message.content or nil
        if type(content) == "string" then
            total = total + chars(content)
        elseif is_array(content) then
            for _, part in ipairs(content) do
                local text = type(part) == "table" and part.text or nil
                if type(text) == "string" then
                    total = total + chars(text)
                end
            end
        end
    end
    return total
end

local KINDS = { stream = "boolean", model = "string" }
local DEFAULTS = { stream = false, n = 1 }

-- The field's value, MISSING, or nil and "field_type" for a value of the wrong type.
local function read_field(field, path, body)
    if field == "path" then
        return path
    end
    if field == "prompt_chars" then
        return prompt_chars(path, body)
    end
    local value
    if field == "max_tokens" then
        value = body.max_completion_tokens
        if value == nil or value == cjson.null then
            value = body.max_tokens
        end
    else
        value = body[field]
    end
    if value == nil or value == cjson.null then
        local default = DEFAULTS[field]
        if default == nil then
            return MISSING
        end
        return default
    end
    if type(value) ~= (KINDS[field] or "number") then
        return nil, "field_type"
    end
    return value
end

local function member(value, list)
    for _, item in ipairs(list) do
        if value == item then
            return true
        end
    end
    return false
end

local function holds(condition, value)
    if value == MISSING then
        return false
    end
    for _, op in ipairs(condition.ops) do
        local name, limit = op[1], op[2]
        local ok
        if name == "lt" then
            ok = value < limit
        elseif name == "le" then
            ok = value <= limit
        elseif name == "gt" then
            ok = value > limit
        elseif name == "ge" then
            ok = value >= limit
        elseif name == "eq" then
            ok = value == limit
        elseif name == "ne" then
            ok = value ~= limit
        elseif name == "in" then
            ok = member(value, limit)
        else
            ok = not member(value, limit)
        end
        if not ok then
            return false
        end
    end
    return true
end

local function body_text()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if data then
        return data
    end
    local path = ngx.req.get_body_file()
    if path then
        -- over client_body_buffer_size: nginx wrote the body to a file; read it, never route blind
        return read_file(path)
    end
    return ""  -- no body
end

-- The class and pool of this request, and why it is malformed (nil when it is not).
local function decide(path)
    if ngx.req.get_method() ~= "POST" or not PATHS[path] then
        return "other", rules.default_pool
    end
    local text = body_text()
    if text == nil then
        return "malformed", rules.default_pool, "unreadable_body"
    end
    local body = cjson.decode(text)
    if body == nil then
        return "malformed", rules.default_pool, "json"
    end
    if type(body) ~= "table" or not string.find(text, "^[ \t\r\n]*{") then
        return "malformed", rules.default_pool, "not_object"
    end
    local values, missing = {}, {}
    for _, field in ipairs(rules.fields) do
        local value, err = read_field(field, path, body)
        if err then
            return "malformed", rules.default_pool, err
        end
        values[field] = value
        if value == MISSING then
            missing[#missing + 1] = field
        end
    end
    for _, field in ipairs(missing) do
        count("miss|" .. field)
    end
    for _, class in ipairs(rules.classes) do
        local all = true
        for _, condition in ipairs(class.when) do
            if not holds(condition, values[condition.field]) then
                all = false
                break
            end
        end
        if all then
            return class.name, class.pool
        end
    end
    return "default", rules.default_pool
end

-- access_by_lua: label the request and pick its upstream.
function M.route()
    local class, pool, malformed = decide(ngx.var.uri)
    if malformed then
        count("mal|" .. malformed)
        ngx.log(ngx.INFO, "specguard routing: malformed request (", malformed, "): the default pool")
    end
    if ngx.shared[DICT]:get("fallback") then
        pool = rules.fallback_pool
    end
    ngx.var.specguard_class = class
    ngx.var.specguard_pool = pool
    ngx.var.specguard_upstream = "specguard_" .. pool
    ngx.req.set_header("X-Specguard-Class", class)
    ngx.req.set_header("X-Specguard-Pool", pool)
end

-- log_by_lua: count the request and its time.
function M.log()
    local class, pool = ngx.var.specguard_class, ngx.var.specguard_pool
    if class == nil or class == "" or class == "-" then
        return  -- refused before it was routed (a body over the limit)
    end
    local dict = ngx.shared[DICT]
    local series = class .. "|" .. pool
    dict:incr("req|" .. series, 1, 0)
    local seconds = tonumber(ngx.var.request_time) or 0
    for index, bound in ipairs(BUCKETS) do
        if seconds <= bound then
            dict:incr("hb|" .. series .. "|" .. index, 1, 0)
        end
    end
    dict:incr("hc|" .. series, 1, 0)
    dict:incr("hs|" .. series, seconds, 0)
end

local function flag_state()
    local dict = ngx.shared[DICT]
    return {
        fallback = dict:get("fallback") == true,
        since = dict:get("fallback_since"),
        source = dict:get("fallback_source"),
    }
end

local function answer(status, body)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode(body))
    return ngx.exit(status)
end

-- content_by_lua of GET/PUT /specguard/flag on the admin server.
function M.flag()
    local method = ngx.req.get_method()
    if method == "GET" or method == "HEAD" then
        return answer(200, flag_state())
    end
    if method ~= "PUT" and method ~= "POST" then
        ngx.header["Allow"] = "GET, PUT"
        return answer(405, { error = "use GET to read the flag, PUT {\"fallback\": true|false} to set it" })
    end
    local text = body_text()
    local body = text and cjson.decode(text)
    if type(body) ~= "table" or type(body.fallback) ~= "boolean" then
        return answer(400, { error = "the body must be {\"fallback\": true} or {\"fallback\": false}" })
    end
    local dict = ngx.shared[DICT]
    if dict:get("fallback") ~= body.fallback then
        dict:set("fallback_since", ngx.now())
    end
    dict:set("fallback", body.fallback)
    dict:set("fallback_source", "admin")
    ngx.log(ngx.NOTICE, "specguard routing: fallback ", body.fallback and "engaged" or "restored")
    return answer(200, flag_state())
end

-- content_by_lua of GET /specguard/metrics: the router's counters, Prometheus text format.
function M.metrics()
    local dict = ngx.shared[DICT]
    local requests, malformed, missing, hist = {}, {}, {}, {}
    for _, key in ipairs(dict:get_keys(0)) do
        local kind, rest = string.match(key, "^(%a+)|(.*)$")
        local value = dict:get(key)
        if kind == "req" then
            requests[#requests + 1] = { rest, value }
        elseif kind == "mal" then
            malformed[#malformed + 1] = { rest, value }
        elseif kind == "miss" then
            missing[#missing + 1] = { rest, value }
        elseif kind == "hb" or kind == "hc" or kind == "hs" then
            hist[key] = value
        end
    end
    local out = {}
    local function add(line)
        out[#out + 1] = line
    end
    local function labels(series)
        local class, pool = string.match(series, "^(.-)|(.*)$")
        return 'class="' .. class .. '",pool="' .. pool .. '"'
    end
    table.sort(requests, function(a, b) return a[1] < b[1] end)
    add("# HELP specguard_route_requests_total Requests routed, by traffic class and pool.")
    add("# TYPE specguard_route_requests_total counter")
    for _, item in ipairs(requests) do
        add("specguard_route_requests_total{" .. labels(item[1]) .. "} " .. item[2])
    end
    add("# HELP specguard_route_request_duration_seconds Time nginx spent on each routed request.")
    add("# TYPE specguard_route_request_duration_seconds histogram")
    for _, item in ipairs(requests) do
        local series, l = item[1], labels(item[1])
        for index, bound in ipairs(BUCKETS) do
            add(string.format('specguard_route_request_duration_seconds_bucket{%s,le="%s"} %d',
                l, tostring(bound), hist["hb|" .. series .. "|" .. index] or 0))
        end
        local n = hist["hc|" .. series] or 0
        add(string.format('specguard_route_request_duration_seconds_bucket{%s,le="+Inf"} %d', l, n))
        add(string.format("specguard_route_request_duration_seconds_sum{%s} %.6f", l, hist["hs|" .. series] or 0))
        add(string.format("specguard_route_request_duration_seconds_count{%s} %d", l, n))
    end
    add("# HELP specguard_route_malformed_total Requests whose body could not be classified, by reason.")
    add("# TYPE specguard_route_malformed_total counter")
    table.sort(malformed, function(a, b) return a[1] < b[1] end)
    for _, item in ipairs(malformed) do
        add('specguard_route_malformed_total{reason="' .. item[1] .. '"} ' .. item[2])
    end
    add("# HELP specguard_route_missing_field_total Requests without a field some class tests, by field.")
    add("# TYPE specguard_route_missing_field_total counter")
    table.sort(missing, function(a, b) return a[1] < b[1] end)
    for _, item in ipairs(missing) do
        add('specguard_route_missing_field_total{field="' .. item[1] .. '"} ' .. item[2])
    end
    add("# HELP specguard_route_fallback_engaged 1 while every request goes to the fallback pool.")
    add("# TYPE specguard_route_fallback_engaged gauge")
    add("specguard_route_fallback_engaged " .. (dict:get("fallback") and 1 or 0))
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(table.concat(out, "\n") .. "\n")
end

return M

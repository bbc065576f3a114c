-- Argo CD health check for nopstream.io/StreamJob (resource.customizations.health.nopstream.io_StreamJob).
-- It reads what the operator writes: the phase, and the Ready, Progressing and Degraded
-- conditions (Ready is True only while epochs keep becoming durable: docs/operator.md).
-- Tested on Lua 5.1, the language of Argo CD's interpreter (tests/operator/test_argocd_health.py).
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status == nil then
  return hs
end
local conditions = {}
for _, c in ipairs(obj.status.conditions or {}) do
  conditions[c.type] = c
end
local function said(c, otherwise)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return otherwise
end
local phase = obj.status.phase or "Pending"
if phase == "Invalid" or phase == "Failed" then
  hs.status = "Degraded"
  hs.message = said(conditions["Degraded"], phase)
elseif phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = said(conditions["Ready"], "suspended")
elseif phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = said(conditions["Ready"], "the final epoch is committed")
elseif conditions["Degraded"] ~= nil and conditions["Degraded"].status == "True" then
  hs.status = "Degraded"
  hs.message = said(conditions["Degraded"], "degraded")
elseif conditions["Ready"] ~= nil and conditions["Ready"].status == "True" then
  hs.status = "Healthy"
  hs.message = said(conditions["Ready"], "ready")
else
  hs.message = said(conditions["Ready"], phase)
end
return hs

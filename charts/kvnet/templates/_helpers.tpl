{{/* Chart name, overridable. */}}
{{- define "kvnet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-kvnet, or the release name when it already says kvnet. */}}
{{- define "kvnet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "kvnet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvnet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select kvnet's pods; never change them on upgrade. */}}
{{- define "kvnet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvnet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvnet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvnet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Secret with the serving certificate, in both cert modes. */}}
{{- define "kvnet.certSecret" -}}
{{- default (printf "%s-webhook-cert" (include "kvnet.fullname" .)) .Values.certs.secretName }}
{{- end }}

{{/* Namespaces the webhooks never select: the config's and the release's own. */}}
{{- define "kvnet.excludedNamespaces" -}}
{{- $ns := list }}
{{- range (default (list "kube-system") .Values.config.excludedNamespaces) }}
{{- $ns = append $ns . }}
{{- end }}
{{- $ns = append $ns .Release.Namespace }}
{{- toJson ($ns | uniq) }}
{{- end }}

{{/*
Sidecar mode of the migration proxy: "true" when the proxy runs inside
KubeVirt's synchronization-controller pods (injected by kvnet's
migration-pods webhook) instead of as a Deployment of its own.
*/}}
{{- define "kvnet.proxySidecar" -}}
{{- if and .Values.migrationProxy.enabled .Values.migrationProxy.sidecar.enabled }}true{{ end -}}
{{- end }}

{{/*
Name of the migration proxy's objects (lease, RBAC, peers ConfigMap).
*/}}
{{- define "kvnet.proxyName" -}}
{{- printf "%s-migration-proxy" (include "kvnet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
kvnet's config section migration.proxySidecar: the container the
migration-pods webhook injects into each synchronization-controller pod, and
its volumes. Same flags as the Deployment's container, except that it always
takes its addresses from the pod's own interfaces (each replica's relays
listen on its own migration0) and names kvnet's namespace explicitly (the
pod runs in KubeVirt's).
*/}}
{{- define "kvnet.proxySidecarConfig" -}}
{{- $p := .Values.migrationProxy -}}
{{- $name := include "kvnet.proxyName" . -}}
enabled: true
container:
  name: {{ $p.sidecar.containerName }}
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - proxy
    - --advertise-interface={{ $p.advertiseInterface }}
    {{- if $p.peers }}
    - --hop-interface={{ $p.hopInterface }}
    - --hop-port={{ $p.hopPort }}
    - --peers=/etc/kvnet/proxy-peers/peers.yaml
    - --cert-file=/etc/kvnet/proxy/tls.crt
    - --key-file=/etc/kvnet/proxy/tls.key
    - --kubevirt-ca-sync={{ $p.kubevirtCA.sync }}
    - --kubevirt-namespace={{ $p.kubevirtCA.namespace | default $p.sidecar.namespace }}
    - --kubevirt-ca-sync-interval={{ $p.kubevirtCA.interval }}
    {{- end }}
    - --mode={{ $p.mode }}
    - --max-migrations={{ $p.maxMigrations }}
    {{- with $p.maxMigrationsPerNamespace }}
    - --max-migrations-per-namespace={{ . }}
    {{- end }}
    {{- range (include "kvnet.proxyAllowedSources" $ | fromJsonArray) }}
    - --allowed-sources={{ . }}
    {{- end }}
    - --dial-timeout={{ $p.dialTimeout }}
    - --metrics-bind-address=:{{ .Values.ports.metrics }}
    - --health-probe-bind-address=:{{ .Values.ports.probes }}
    - --leader-elect=true
    - --leader-election-id={{ $name }}
    - --namespace={{ .Release.Namespace }}
  ports:
    # Beside the sync container's 8443 (metrics) and 9185 (sync).
    - name: proxy-metrics
      containerPort: {{ .Values.ports.metrics }}
      protocol: TCP
    - name: proxy-probes
      containerPort: {{ .Values.ports.probes }}
      protocol: TCP
  {{- if $p.peers }}
  volumeMounts:
    - name: kvnet-proxy-peers
      mountPath: /etc/kvnet/proxy-peers
      readOnly: true
    - name: kvnet-proxy-cert
      mountPath: /etc/kvnet/proxy
      readOnly: true
  {{- end }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: proxy-probes
    initialDelaySeconds: 10
    periodSeconds: 20
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
  resources:
    {{- toYaml $p.resources | nindent 4 }}
{{- if $p.peers }}
volumes:
  - name: kvnet-proxy-peers
    configMap:
      name: {{ $name }}-peers
  - name: kvnet-proxy-cert
    secret:
      secretName: {{ required "migrationProxy.certSecret: a Secret in migrationProxy.sidecar.namespace with the proxy's tls.crt/tls.key (server and client use)" $p.certSecret }}
{{- end }}
{{- end }}

{{/*
The namespaces of the migration address holders, sorted, as JSON: what
config.Migration.HolderNamespaces returns for the config the chart renders
(KubeVirt's namespace, and the release namespace for a separate proxy).
*/}}
{{- define "kvnet.migrationHolderNamespaces" -}}
{{- $cfg := .Values.config | default dict -}}
{{- $mig := get $cfg "migration" | default dict -}}
{{- $kv := get $mig "namespace" | default .Values.migrationProxy.sidecar.namespace -}}
{{- $ns := list -}}
{{- range $k := list "inCluster" "crossCluster" -}}
{{- $sec := get $mig $k -}}
{{- if $sec -}}
{{- $holders := get $sec "holders" -}}
{{- if and (not (hasKey $sec "holders")) (eq $k "crossCluster") $.Values.migrationProxy.enabled (not (include "kvnet.proxySidecar" $)) -}}
{{- $holders = list (dict) (dict "namespace" $.Release.Namespace) -}}
{{- end -}}
{{- if not $holders -}}
{{- $holders = list (dict) -}}
{{- end -}}
{{- range $h := $holders -}}
{{- $ns = append $ns (get $h "namespace" | default $kv) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson ($ns | uniq | sortAlpha) -}}
{{- end }}

{{/*
The clients the proxy's source listeners accept, as JSON:
migrationProxy.allowedSources, else the in-cluster migration pool's CIDR
(the virt-handlers dial from their migration0 addresses), so a relay is
never open to every address by default.
*/}}
{{- define "kvnet.proxyAllowedSources" -}}
{{- $p := .Values.migrationProxy -}}
{{- if $p.allowedSources -}}
{{- toJson $p.allowedSources -}}
{{- else -}}
{{- $cidr := dig "migration" "inCluster" "pool" "cidr" "" (.Values.config | default dict) -}}
{{- if $cidr }}{{ toJson (list $cidr) }}{{ else }}{{ fail "migrationProxy.allowedSources: set the in-cluster migration ranges the source virt-handlers connect from, or config.migration.inCluster.pool.cidr (its default); the proxy accepts no client outside them" }}{{ end -}}
{{- end -}}
{{- end }}
